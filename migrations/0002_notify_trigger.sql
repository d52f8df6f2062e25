-- Notifications of relay job changes come from one place: this trigger. Every new job and
-- every change of a job's state NOTIFYs channel relay_jobs with the job id (Postgres
-- delivers them at commit, once per distinct payload per transaction).
-- depends: 0001_initial

CREATE FUNCTION relay_jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_jobs', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER relay_jobs_notify_insert AFTER INSERT ON relay_jobs
    FOR EACH ROW EXECUTE FUNCTION relay_jobs_notify();

CREATE TRIGGER relay_jobs_notify_state AFTER UPDATE OF state ON relay_jobs
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION relay_jobs_notify();
