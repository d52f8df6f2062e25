-- A job keeps the quote total (retirement cost + fee, input-token atomic units) it was
-- accepted with, so that it can be simulated again from the row alone: a job a crashed
-- process left in `accepted` is resumed by the identical request or by a sweep.
-- depends: 0004_lease_epoch

ALTER TABLE relay_jobs ADD COLUMN quote_total NUMERIC(78, 0);
