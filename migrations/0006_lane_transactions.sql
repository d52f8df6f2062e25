-- Every transaction of an executor lane is journaled before it is broadcast: a job's first
-- transaction, its same-nonce fee-bumped replacements (replaced_by points to the next), and
-- no-ops (zero-value self-transfers) that take a nonce no job will: a hole in the lane, or the
-- nonce of a job whose authorization expired before fees came back under its allowance.
-- Whichever of a nonce's transactions is mined wins (mined_block).
-- depends: 0005_job_quote_total

ALTER TABLE relay_transactions ALTER COLUMN job_id DROP NOT NULL;
ALTER TABLE relay_transactions ADD COLUMN kind TEXT NOT NULL DEFAULT 'relay' CHECK (kind IN ('relay', 'noop'));
ALTER TABLE relay_transactions ADD COLUMN replaced_by BYTEA;
ALTER TABLE relay_transactions ADD COLUMN mined_block BIGINT;
CREATE INDEX relay_transactions_lane ON relay_transactions (chain_id, executor, nonce) WHERE mined_block IS NULL;

-- A job whose nonce went to a no-op is `dropped`: nothing was spent, its salt stays spent,
-- and (kVCM) its permit nonce is free again.
ALTER TABLE relay_jobs DROP CONSTRAINT relay_jobs_state_check;
ALTER TABLE relay_jobs ADD CONSTRAINT relay_jobs_state_check CHECK (state IN ('accepted', 'simulated',
    'signed', 'submitted', 'mined', 'confirmed', 'indexed', 'rejected', 'reverted', 'dropped'));
DROP INDEX relay_jobs_live_permit;
CREATE UNIQUE INDEX relay_jobs_live_permit ON relay_jobs (chain_id, permit_key)
    WHERE permit_key IS NOT NULL AND state NOT IN ('rejected', 'reverted', 'dropped');
