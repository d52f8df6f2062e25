-- Issue 8. A notification names the job's new state beside its id ("42:indexed"), so a
-- request waiting for its answer wakes only for the states that answer it (indexed,
-- rejected, dropped, reverted) instead of reading the job again at every step. Listeners
-- still accept a bare id (a daemon of this release beside a database of the last).
-- depends: 0007_payer_reservations_and_ledger

CREATE OR REPLACE FUNCTION relay_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_jobs', NEW.id::text || ':' || NEW.state);
    RETURN NULL;
END
$$;
