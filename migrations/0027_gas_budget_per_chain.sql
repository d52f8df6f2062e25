-- Issue 39. A facilitator key's daily gas budget is per chain: the wei of gas a key's settles
-- cost on Base and on Base Sepolia are different money, and one daemon now relays on both. A
-- budget row is the key's, the chain's and the UTC day's. Rows of older releases are of the one
-- chain their database served: the chain of the key's jobs (a row exists only once a job of the
-- key reserved gas; a row no job of any chain explains is dropped, it holds no reservation).
-- depends: 0026_api_key_use
ALTER TABLE api_key_gas_days ADD COLUMN chain_id INTEGER;
UPDATE api_key_gas_days d SET chain_id = coalesce(
    (SELECT j.chain_id FROM relay_jobs j WHERE j.api_key_id = d.api_key_id ORDER BY j.id DESC LIMIT 1),
    (SELECT min(j.chain_id) FROM relay_jobs j)
);
DELETE FROM api_key_gas_days WHERE chain_id IS NULL;
ALTER TABLE api_key_gas_days ALTER COLUMN chain_id SET NOT NULL;
ALTER TABLE api_key_gas_days DROP CONSTRAINT api_key_gas_days_pkey;
ALTER TABLE api_key_gas_days ADD PRIMARY KEY (api_key_id, chain_id, day);

-- The job's end settles its reservation in its own chain's row (as migration 0015, by chain).
CREATE OR REPLACE FUNCTION relay_jobs_settle_gas() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE api_key_gas_days SET
        reserved_wei = greatest(reserved_wei - NEW.gas_reserved_wei, 0),
        paid_wei = paid_wei + (SELECT coalesce(sum(t.paid_wei), 0) FROM relay_transactions t
                               WHERE t.job_id = NEW.id AND t.mined_block IS NOT NULL),
        settles = settles + CASE WHEN NEW.state IN ('mined', 'reverted') THEN 1 ELSE 0 END
    WHERE api_key_id = NEW.api_key_id AND chain_id = NEW.chain_id AND day = NEW.gas_reserved_on;
    NEW.gas_reserved_wei := NULL;
    NEW.gas_reserved_on := NULL;
    RETURN NEW;
END
$$;
