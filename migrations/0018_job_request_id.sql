-- Issue 21. The X-Request-ID of the HTTP request that made a job, so that the lines the
-- workers write about it (signed, submitted, mined, confirmed, indexed, reorged), in any
-- process and after a restart, name the request a client or an operator follows. NULL for a
-- job no HTTP request made. The charset and length are the API's (relayer.api.http
-- request_id_of): a client's id is kept only when it is 1 to 64 of these characters.
ALTER TABLE relay_jobs
    ADD COLUMN request_id TEXT CHECK (request_id ~ '^[A-Za-z0-9_.:+/=-]{1,64}$');
