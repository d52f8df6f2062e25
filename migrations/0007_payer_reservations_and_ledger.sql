-- Issue 7. Per-payer reservations: a payer's jobs are summed against its token balance
-- before a new one is recorded. The solvency ledger: what the executor paid for each mined
-- transaction (gas used times effective gas price, plus the L1 data fee the receipt
-- reports), against what the job's signed gas allowance was worth when it was priced.
-- depends: 0006_lane_transactions

CREATE INDEX relay_jobs_payer ON relay_jobs (chain_id, payer, input_token);
-- Also where rejected rows are purged from after their retention period.
CREATE INDEX relay_jobs_rejected ON relay_jobs (updated_at) WHERE state = 'rejected';

-- The signed gas allowance in wei, at the conversion used to price the job (rounded down).
ALTER TABLE relay_jobs ADD COLUMN allowance_wei NUMERIC(78, 0);

ALTER TABLE relay_transactions ADD COLUMN gas_used BIGINT;
ALTER TABLE relay_transactions ADD COLUMN paid_wei NUMERIC(78, 0);
ALTER TABLE relay_transactions ADD COLUMN succeeded BOOLEAN;
