-- Issue 20. What a payer's other jobs may still take, summed as a supply's is (migration 0022):
-- the jobs in flight plus the jobs mined after the block read, each part over a partial index
-- of its own. The one index on (chain_id, payer, input_token) held every job the payer ever
-- had, and an entry for each of its steps: a payer that retires often (an agent paying
-- from one wallet) had every reservation, under that payer's lock, and every signing batch's
-- check read its whole history. The two partial indexes replace it: a job's step enters at
-- most one of them, where it entered the full one every time. The indexes are built here
-- without CONCURRENTLY (as migration 0012's), which blocks writes to relay_jobs while they
-- build; an operator with a large table may build them CONCURRENTLY, with these names and
-- definitions, before migrating (IF NOT EXISTS then skips them).
-- depends: 0022_supply_sum_by_index

CREATE INDEX IF NOT EXISTS relay_jobs_payer_in_flight ON relay_jobs (chain_id, payer, input_token)
    WHERE state IN ('accepted', 'simulated', 'signed', 'submitted');
CREATE INDEX IF NOT EXISTS relay_jobs_payer_mined ON relay_jobs (chain_id, payer, input_token, block_number)
    WHERE state IN ('mined', 'confirmed', 'indexed');
DROP INDEX IF EXISTS relay_jobs_payer;

CREATE OR REPLACE FUNCTION relay_payer_reserved(
    p_chain_id integer, p_payer text, p_token text, p_block bigint, p_bound_nonce bytea
) RETURNS numeric LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('payer:' || p_chain_id || ':' || p_payer || ':' || p_token, 0));
    RETURN (
        SELECT coalesce(sum(auth_value), 0) FROM relay_jobs
        WHERE chain_id = p_chain_id AND payer = p_payer AND input_token = p_token
          AND bound_nonce <> p_bound_nonce
          AND state IN ('accepted', 'simulated', 'signed', 'submitted')
          AND auth_expires_at > extract(epoch FROM now())::bigint - 60
    ) + (
        SELECT coalesce(sum(auth_value), 0) FROM relay_jobs
        WHERE chain_id = p_chain_id AND payer = p_payer AND input_token = p_token
          AND bound_nonce <> p_bound_nonce
          AND state IN ('mined', 'confirmed', 'indexed') AND block_number > p_block
    );
END
$$;
