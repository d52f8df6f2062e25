-- Issue 8. Notifications that name the job's new state ("42:indexed") on a channel of their
-- own, relay_job_states, so a request waiting for its answer wakes only for the states that
-- answer it (indexed, rejected, dropped, reverted) instead of reading the job again at every
-- step. The bare id still goes out on relay_jobs, which daemons of the last release listen
-- to: they keep working beside this release during a rolling upgrade.
-- depends: 0007_payer_reservations_and_ledger

CREATE OR REPLACE FUNCTION relay_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_jobs', NEW.id::text);
    PERFORM pg_notify('relay_job_states', NEW.id::text || ':' || NEW.state);
    RETURN NULL;
END
$$;
