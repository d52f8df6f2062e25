-- Issue 20. A reservation's lock and what the others of that payer or supply may still take,
-- in one round trip: each function takes the transaction-scoped advisory lock (the same key
-- as the statements it replaces, LOCK_PAYER and LOCK_SUPPLY in relayer/store/relay_jobs.py,
-- so a daemon of the last release serialises with this one during a rolling upgrade), then
-- sums. Both are VOLATILE: the sum is a query of its own, with a snapshot taken after the
-- lock was granted, so it sees every reservation committed while this one waited (the two
-- statements did the same in two round trips). Under load every fill of one listing or class
-- credit queues on its supply's lock; each round trip under it was a wait for all of them.
-- depends: 0018_job_request_id

-- What the payer's other jobs may still take from its token balance as read at block
-- p_block (RESERVED_BY_PAYER), after taking the payer's lock (LOCK_PAYER).
CREATE OR REPLACE FUNCTION relay_payer_reserved(
    p_chain_id integer, p_payer text, p_token text, p_block bigint, p_bound_nonce bytea
) RETURNS numeric LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('payer:' || p_chain_id || ':' || p_payer || ':' || p_token, 0));
    RETURN (
        SELECT coalesce(sum(auth_value), 0) FROM relay_jobs
        WHERE chain_id = p_chain_id AND payer = p_payer AND input_token = p_token
          AND bound_nonce <> p_bound_nonce
          AND ((state IN ('accepted', 'simulated', 'signed', 'submitted')
                AND auth_expires_at > extract(epoch FROM now())::bigint - 60)
               OR (state IN ('mined', 'confirmed', 'indexed') AND block_number > p_block))
    );
END
$$;

-- What the other jobs of a supply may still take from it as read at block p_block
-- (RESERVED_SUPPLY), after taking the supply's lock (LOCK_SUPPLY).
CREATE OR REPLACE FUNCTION relay_supply_reserved(
    p_chain_id integer, p_source integer, p_id numeric, p_token_id numeric, p_block bigint,
    p_bound_nonce bytea
) RETURNS numeric LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended('supply:' || p_chain_id || ':' || p_source || ':' || p_id::text || ':'
                         || p_token_id::text, 0));
    RETURN (
        SELECT coalesce(sum(supply_units), 0) FROM relay_jobs
        WHERE chain_id = p_chain_id AND supply_source = p_source AND supply_id = p_id
          AND supply_token_id = p_token_id AND bound_nonce <> p_bound_nonce
          AND ((state IN ('accepted', 'simulated', 'signed', 'submitted')
                AND auth_expires_at > extract(epoch FROM now())::bigint - 60)
               OR (state IN ('mined', 'confirmed', 'indexed') AND block_number > p_block))
    );
END
$$;
