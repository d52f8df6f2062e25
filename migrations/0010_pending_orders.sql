-- Issue 17. -- Orders whose hand-over to the relay did not finish (an outage, or a process that died
-- between recording the order and its relay job) are found by the order keeper, oldest first.
CREATE INDEX orders_pending ON orders (created_at) WHERE job_id IS NULL AND error IS NULL;
