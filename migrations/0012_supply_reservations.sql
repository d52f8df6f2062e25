-- Issue 18. Supply in flight is reserved: each job records the supply its fill takes (the
-- retirement's source, 0 carbon class or 1 listing; the class or listing id; the credit's
-- token id; credit units), so a new job, and a signing batch, are checked against a
-- listing's leftToSell or a class credit's liquidity less what the jobs in flight will take.
-- Jobs recorded before this migration have none (NULL): they reserve no supply.
ALTER TABLE relay_jobs ADD COLUMN supply_source SMALLINT;
ALTER TABLE relay_jobs ADD COLUMN supply_id NUMERIC(78, 0);
ALTER TABLE relay_jobs ADD COLUMN supply_token_id NUMERIC(78, 0);
ALTER TABLE relay_jobs ADD COLUMN supply_units BIGINT;

-- The jobs in flight of one supply, and those mined of it (summed above the block a supply
-- figure was read at).
CREATE INDEX relay_jobs_supply_in_flight ON relay_jobs (chain_id, supply_source, supply_id, supply_token_id)
    WHERE state IN ('accepted', 'simulated', 'signed', 'submitted');
CREATE INDEX relay_jobs_supply_mined ON relay_jobs (chain_id, supply_source, supply_id, supply_token_id, block_number)
    WHERE state IN ('mined', 'confirmed', 'indexed');
