-- Issue 19 (design: docs/design/x402-v2.md, C3). API keys gain scopes (what they may call:
-- 'marketplace' quotes and orders, 'facilitator' verify and settle), a per-key rate limit (a
-- `limits` string such as '50/second'; NULL: RELAYER_FACILITATOR_DEFAULT_RATE_LIMIT) and a
-- daily gas budget in wei (NULL: RELAYER_FACILITATOR_DEFAULT_GAS_BUDGET_WEI_PER_DAY).
-- Existing keys keep working as marketplace keys.
ALTER TABLE api_keys ADD COLUMN scopes TEXT[] NOT NULL DEFAULT '{marketplace}';
ALTER TABLE api_keys ADD COLUMN rate_limit TEXT;
ALTER TABLE api_keys ADD COLUMN gas_budget_wei_per_day NUMERIC(78, 0) CHECK (gas_budget_wei_per_day >= 0);

-- The gas each key's transfers may cost per UTC day, authoritative here: a settle reserves its
-- fee ceiling (reserved_wei) in the transaction that records its job, refused when
-- reserved_wei + paid_wei + the ceiling would pass the key's budget; the job's end moves its
-- reservation out (and what its mined transaction cost the executor into paid_wei).
CREATE TABLE api_key_gas_days (
    api_key_id   BIGINT         NOT NULL REFERENCES api_keys (id),
    day          DATE           NOT NULL,
    reserved_wei NUMERIC(78, 0) NOT NULL DEFAULT 0 CHECK (reserved_wei >= 0),
    paid_wei     NUMERIC(78, 0) NOT NULL DEFAULT 0,
    settles      INTEGER        NOT NULL DEFAULT 0,
    PRIMARY KEY (api_key_id, day)
);

-- The UTC day whose budget row holds a transfer job's reservation (relay_jobs.gas_reserved_wei,
-- migration 0014; NULL once the reservation was settled or released).
ALTER TABLE relay_jobs ADD COLUMN gas_reserved_on DATE;

-- A reservation follows its job's state, whatever code path moves it (one place): when a job
-- holding one ends (mined or reverted: its receipt was recorded, in the follower's transaction;
-- rejected or dropped: nothing of it will be mined), the day's reserved_wei gives it back,
-- paid_wei takes what the job's mined transactions cost the executor (relay_transactions.paid_wei,
-- recorded in the same transaction just before: 0 for a job never sent), settles counts a job
-- whose receipt was recorded, and the job's reservation is cleared so a reorg that mines it again
-- counts nothing twice.
CREATE FUNCTION relay_jobs_settle_gas() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE api_key_gas_days SET
        reserved_wei = greatest(reserved_wei - NEW.gas_reserved_wei, 0),
        paid_wei = paid_wei + (SELECT coalesce(sum(t.paid_wei), 0) FROM relay_transactions t
                               WHERE t.job_id = NEW.id AND t.mined_block IS NOT NULL),
        settles = settles + CASE WHEN NEW.state IN ('mined', 'reverted') THEN 1 ELSE 0 END
    WHERE api_key_id = NEW.api_key_id AND day = NEW.gas_reserved_on;
    NEW.gas_reserved_wei := NULL;
    NEW.gas_reserved_on := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER relay_jobs_settle_gas BEFORE UPDATE OF state ON relay_jobs
    FOR EACH ROW
    WHEN (NEW.gas_reserved_wei IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state
          AND NEW.state IN ('mined', 'reverted', 'rejected', 'dropped'))
    EXECUTE FUNCTION relay_jobs_settle_gas();
