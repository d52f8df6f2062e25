-- Issue 19. A second job kind: 'transfer', an EIP-3009 transferWithAuthorization on the token
-- (the job's settlement column holds the call target, the token), sent by the executor lanes
-- like a retirement and final at 'confirmed' (nothing to index). Its keys make a second job for
-- one authorization impossible through the existing uniqueness: bound_nonce =
-- keccak256(abi.encode(token, from, nonce)), salt = keccak256("relayer/x402-transfer/v1" ||
-- bound_nonce). api_key_id names who pays the gas (NULL: the operator); gas_reserved_wei is the
-- gas reserved against that key's budget (both unused until keys and budgets exist).
ALTER TABLE relay_jobs ADD COLUMN kind TEXT NOT NULL DEFAULT 'retire' CHECK (kind IN ('retire', 'transfer'));
ALTER TABLE relay_jobs ADD COLUMN api_key_id BIGINT REFERENCES api_keys (id);
ALTER TABLE relay_jobs ADD COLUMN gas_reserved_wei NUMERIC(78, 0);

-- Open jobs: a confirmed transfer is final, so it is not open.
DROP INDEX relay_jobs_open;
CREATE INDEX relay_jobs_open ON relay_jobs (state)
    WHERE state IN ('simulated', 'signed', 'submitted', 'mined', 'confirmed')
      AND NOT (kind = 'transfer' AND state = 'confirmed');
