-- Issue 20. What the other jobs of a supply may still take, summed in two parts, each over its
-- own partial index: the jobs in flight (relay_jobs_supply_in_flight) plus the jobs mined after
-- the block read (relay_jobs_supply_mined). One sum with an OR of the two (migration 0019) was
-- planned as a bitmap scan of both indexes, or, once a busy supply's rows had churned, a scan
-- of the whole table. A bitmap scan never marks the index entries of dead row versions (each
-- job's steps leave three in the in-flight index) as dead. So until a vacuum came, every
-- reservation of that supply read all of them again, under the supply's lock that every other
-- reservation of it waits for: 1.6 ms a sum, 11.7 ms a reservation waiting for the lock, under
-- the benchmark's load. The plain index scans of the two parts mark them, and the next
-- reservation skips them. The sum, the lock and its key are migration 0019's.
-- depends: 0021_notify_woken_states

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
          AND state IN ('accepted', 'simulated', 'signed', 'submitted')
          AND auth_expires_at > extract(epoch FROM now())::bigint - 60
    ) + (
        SELECT coalesce(sum(supply_units), 0) FROM relay_jobs
        WHERE chain_id = p_chain_id AND supply_source = p_source AND supply_id = p_id
          AND supply_token_id = p_token_id AND bound_nonce <> p_bound_nonce
          AND state IN ('mined', 'confirmed', 'indexed') AND block_number > p_block
    );
END
$$;
