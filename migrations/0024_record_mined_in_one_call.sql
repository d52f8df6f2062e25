-- Issue 20. A block's transactions of ours recorded mined and their jobs moved, in one round
-- trip: relay_record_mined runs the same statements the follower sent one after the other in
-- a transaction of its own (BEGIN; the transactions' marks; each target's jobs; COMMIT: four
-- round trips a block). The statements stay separate inside the function, one after the
-- other: the trigger that settles an API key's gas day (migration 0015) reads a job's
-- transactions' paid_wei as the job moves to mined, and sees the marks the statement before
-- made (within one statement it would not: 4ecac2a). Which states each target may be reached
-- from is the caller's (relayer.domain.states), given as arrays; nothing here names a state
-- to move from.
-- depends: 0023_payer_sums_by_index

CREATE OR REPLACE FUNCTION relay_record_mined(
    p_tx_hashes bytea[], p_blocks bigint[], p_gas_used bigint[], p_paid_wei numeric[], p_succeeded boolean[],
    p_ids bigint[], p_targets text[], p_job_blocks bigint[], p_job_hashes bytea[], p_job_txs bytea[],
    p_mined_from text[], p_reverted_from text[],
    p_dropped bigint[], p_dropped_from text[]
) RETURNS TABLE (
    id bigint, kind text, state text, tx_hash bytea, request_id text, block_number bigint,
    allowance_wei numeric, signed_at timestamptz, submitted_at timestamptz, mined_at timestamptz
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    UPDATE relay_transactions AS t
    SET mined_block = m.block, gas_used = m.gas_used, paid_wei = m.paid_wei, succeeded = m.succeeded
    FROM unnest(p_tx_hashes, p_blocks, p_gas_used, p_paid_wei, p_succeeded)
        AS m(tx_hash, block, gas_used, paid_wei, succeeded)
    WHERE t.tx_hash = m.tx_hash;

    RETURN QUERY
    UPDATE relay_jobs AS j SET
        state = u.target, updated_at = now(),
        mined_at = CASE WHEN u.target = 'mined' THEN now() ELSE j.mined_at END,
        block_number = u.block_number, block_hash = u.block_hash, tx_hash = u.tx_hash
    FROM unnest(p_ids, p_targets, p_job_blocks, p_job_hashes, p_job_txs)
        AS u(id, target, block_number, block_hash, tx_hash)
    WHERE j.id = u.id
      AND j.state = ANY(CASE WHEN u.target = 'mined' THEN p_mined_from ELSE p_reverted_from END)
    RETURNING j.id, j.kind, j.state, j.tx_hash, j.request_id, j.block_number, j.allowance_wei,
              j.signed_at, j.submitted_at, j.mined_at;

    RETURN QUERY
    UPDATE relay_jobs AS j SET state = 'dropped', updated_at = now()
    WHERE j.id = ANY(p_dropped) AND j.state = ANY(p_dropped_from)
    RETURNING j.id, j.kind, j.state, j.tx_hash, j.request_id, j.block_number, j.allowance_wei,
              j.signed_at, j.submitted_at, j.mined_at;
END
$$;
