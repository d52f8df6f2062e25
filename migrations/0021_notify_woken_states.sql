-- Issue 20. A job's change of state is notified only when someone is woken by it: a job
-- become simulated (new work for the broadcasters, relayer/store/notify.py NEW_WORK_STATE),
-- and the states that answer a waiting request (relayer/service/outcome.py ANSWERING_STATES,
-- and confirmed for a transfer job, TRANSFER_ANSWERING_STATES). Before, every insert and every
-- change was notified twice (the bare id on relay_jobs for daemons of issue 7's release, and
-- "<id>:<state>" on relay_job_states): fourteen notifications a retirement, each one a message
-- to every listening daemon, where three wake anyone. Daemons of the release before this one
-- listen to relay_job_states for these same states, so they run beside this release during a
-- rolling upgrade; daemons that listen to relay_jobs predate migration 0008 by many releases.
-- depends: 0020_reserve_in_one_statement

CREATE OR REPLACE FUNCTION relay_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_job_states', NEW.id::text || ':' || NEW.state);
    RETURN NULL;
END
$$;

DROP TRIGGER relay_jobs_notify_insert ON relay_jobs;  -- a new job is accepted: it wakes no one
DROP TRIGGER relay_jobs_notify_state ON relay_jobs;
CREATE TRIGGER relay_jobs_notify_state AFTER UPDATE OF state ON relay_jobs
    FOR EACH ROW WHEN (
        OLD.state IS DISTINCT FROM NEW.state
        AND (NEW.state IN ('simulated', 'indexed', 'rejected', 'dropped', 'reverted')
             OR (NEW.state = 'confirmed' AND NEW.kind = 'transfer'))
    ) EXECUTE FUNCTION relay_jobs_notify();
