-- Issue 20. A reservation in one statement, one round trip: the asynchronous commit, the
-- payer's lock and sum (relay_payer_reserved), the job with its salt, and the supply's lock and
-- sum (relay_supply_reserved) with the fill rule, in one function called outside an explicit
-- transaction (its implicit transaction is the reservation's: a refusal raised in it rolls
-- the whole reservation back). It replaces BEGIN, three statements and COMMIT, five round
-- trips under the payer's and the supply's locks (relayer/store/relay_jobs.py RESERVE).
-- The locks, their order (payer, then supply) and the sums are those of migration 0019.
-- depends: 0019_reserve_locks

-- Whether a fill of p_units credit units fits in a supply of p_left units beside p_reserved
-- units that jobs in flight take first (relayer.domain.fill SupplyRule.admits, its mirror):
-- what is left is max(0, p_left - p_reserved); the fill must not exceed it, and must reach
-- p_min_fill unless it takes all that is left. p_possible false: the supply refuses any fill
-- whatever is reserved (a cancelled or expired listing, say).
CREATE OR REPLACE FUNCTION relay_supply_admits(
    p_left numeric, p_units numeric, p_min_fill numeric, p_possible boolean, p_reserved numeric
) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT p_possible
       AND p_units <= greatest(0, p_left - p_reserved)
       AND (p_units >= p_min_fill OR p_units = greatest(0, p_left - p_reserved))
$$;

-- Record a job (the columns of INSERT_JOB, $1 to $22) and spend its salt, or find the job of
-- the same authorization key (re-opened when it was rejected before signing, for the same
-- request). The row returned is the job's with ``owned`` (true: the caller drives it: created
-- or re-opened now).
-- p_balance (NULL: no payer check): the payer's token balance read at block p_balance_block;
-- the job is recorded only when it covers the job's value beside what the payer's other jobs
-- may still take (raises 'payer_overdrawn', DETAIL that sum).
-- p_supply_block (NULL: no supply check): the block the supply rule's p_left was read at; a
-- job created or re-opened must fit by relay_supply_admits beside what the other jobs of its
-- supply may still take (raises 'supply_short', DETAIL that sum).
-- Raises 'salt_reused' when another authorization spent the salt; a unique violation of
-- relay_jobs_live_permit when another live job holds the permit nonce.
CREATE OR REPLACE FUNCTION relay_reserve(
    p_chain_id integer, p_bound_nonce bytea, p_salt bytea, p_scheme text, p_payer text,
    p_input_token text, p_auth_value numeric, p_gas_allowance numeric, p_request_hash bytea,
    p_settlement text, p_call_data bytea, p_summary jsonb, p_permit_key bytea,
    p_auth_expires_at bigint, p_quote_total numeric, p_supply_source integer,
    p_supply_id numeric, p_supply_token_id numeric, p_supply_units numeric, p_kind text,
    p_api_key_id bigint, p_request_id text,
    p_balance numeric, p_balance_block bigint,
    p_supply_block bigint, p_supply_left numeric, p_supply_min_fill numeric,
    p_supply_possible boolean
) RETURNS TABLE (job relay_jobs, owned boolean) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_job relay_jobs;
    v_spent boolean;
    v_reserved numeric;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF p_balance IS NOT NULL THEN
        v_reserved := relay_payer_reserved(p_chain_id, p_payer, p_input_token, p_balance_block, p_bound_nonce);
        IF v_reserved + p_auth_value > p_balance THEN
            RAISE EXCEPTION 'payer_overdrawn' USING DETAIL = v_reserved::text;
        END IF;
    END IF;
    INSERT INTO relay_jobs (chain_id, bound_nonce, salt, scheme, payer, input_token, auth_value,
                            gas_allowance, request_hash, settlement, call_data, summary, permit_key,
                            auth_expires_at, quote_total, supply_source, supply_id, supply_token_id,
                            supply_units, kind, api_key_id, request_id, state)
    VALUES (p_chain_id, p_bound_nonce, p_salt, p_scheme, p_payer, p_input_token, p_auth_value,
            p_gas_allowance, p_request_hash, p_settlement, p_call_data, p_summary, p_permit_key,
            p_auth_expires_at, p_quote_total, p_supply_source, p_supply_id, p_supply_token_id,
            p_supply_units, p_kind, p_api_key_id, p_request_id, 'accepted')
    ON CONFLICT (chain_id, bound_nonce) DO NOTHING
    RETURNING * INTO v_job;
    IF FOUND THEN
        INSERT INTO spent_salts (chain_id, salt, job_id) VALUES (p_chain_id, p_salt, v_job.id)
        ON CONFLICT (chain_id, salt) DO NOTHING;
        GET DIAGNOSTICS v_spent = ROW_COUNT;
        IF NOT v_spent THEN
            RAISE EXCEPTION 'salt_reused';
        END IF;
    ELSE
        UPDATE relay_jobs SET state = 'accepted', error = NULL, attempts = attempts + 1,
               accepted_at = now(), updated_at = now(), request_id = coalesce(p_request_id, request_id)
        WHERE chain_id = p_chain_id AND bound_nonce = p_bound_nonce AND state = 'rejected'
          AND tx_hash IS NULL AND request_hash = p_request_hash
        RETURNING * INTO v_job;
        IF NOT FOUND THEN
            SELECT * INTO v_job FROM relay_jobs WHERE chain_id = p_chain_id AND bound_nonce = p_bound_nonce;
            RETURN QUERY SELECT v_job, false;
            RETURN;
        END IF;
    END IF;
    -- last, so that the supply's lock is held for the least time: the job's own row, written
    -- above, is left out of what the supply's other jobs take
    IF p_supply_block IS NOT NULL AND p_supply_units IS NOT NULL THEN
        v_reserved := relay_supply_reserved(p_chain_id, p_supply_source, p_supply_id, p_supply_token_id,
                                            p_supply_block, p_bound_nonce);
        IF NOT relay_supply_admits(p_supply_left, p_supply_units, p_supply_min_fill, p_supply_possible,
                                   v_reserved) THEN
            RAISE EXCEPTION 'supply_short' USING DETAIL = v_reserved::text;
        END IF;
    END IF;
    RETURN QUERY SELECT v_job, true;
END
$$;
