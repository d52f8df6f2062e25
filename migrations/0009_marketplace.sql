-- Issue 9. The marketplace catalogue API's state: the carbon project catalogue (loaded by
-- `relayer catalogue load`), and what the catalogue indexer reads from each indexed chain's
-- events: registered credits, seller listings (folded from their events, kept so a reorg can
-- fold them again), and every transfer of a credit token (mint = origination, burn =
-- retirement) for provenance and live supply figures. Then bearer API keys (hashed),
-- single-use quotes and orders (each retired through a relay job). Amounts in credit units
-- (1000 a tonne) and USDC atomic units as NUMERIC(78,0); times in unix seconds where they
-- come from blocks.
-- depends: 0008_notify_state

CREATE TABLE carbon_projects (
    key        TEXT        PRIMARY KEY,
    registry   TEXT        NOT NULL,
    country    TEXT        NOT NULL,
    category   TEXT        NOT NULL,
    record     JSONB       NOT NULL,
    loaded_at  BIGINT      NOT NULL
);
CREATE INDEX carbon_projects_country_category ON carbon_projects (lower(country), category, key);
CREATE INDEX carbon_projects_category ON carbon_projects (category, key);

CREATE TABLE chain_credits (
    chain_id      INTEGER        NOT NULL,
    credit_token  TEXT           NOT NULL,
    token_id      NUMERIC(78, 0) NOT NULL,
    project_key   TEXT           NOT NULL,
    vintage       INTEGER        NOT NULL,
    registry      TEXT           NOT NULL,
    block_number  BIGINT         NOT NULL,
    PRIMARY KEY (chain_id, credit_token, token_id)
);
CREATE INDEX chain_credits_project ON chain_credits (project_key);

CREATE TABLE listing_events (
    chain_id         INTEGER        NOT NULL,
    block_number     BIGINT         NOT NULL,
    log_index        INTEGER        NOT NULL,
    tx_hash          BYTEA          NOT NULL,
    block_timestamp  BIGINT         NOT NULL,
    marketplace      TEXT           NOT NULL,
    listing_id       NUMERIC(78, 0) NOT NULL,
    kind             TEXT           NOT NULL CHECK (kind IN ('created', 'updated', 'filled', 'cancelled')),
    data             JSONB          NOT NULL,
    PRIMARY KEY (chain_id, block_number, log_index)
);
CREATE INDEX listing_events_listing ON listing_events (chain_id, marketplace, listing_id, block_number, log_index);

CREATE TABLE listings (
    chain_id           INTEGER        NOT NULL,
    marketplace        TEXT           NOT NULL,
    listing_id         NUMERIC(78, 0) NOT NULL,
    seller             TEXT           NOT NULL,
    credit_token       TEXT           NOT NULL,
    token_id           NUMERIC(78, 0) NOT NULL,
    unit_price         NUMERIC(78, 0) NOT NULL,
    total_amount       NUMERIC(78, 0) NOT NULL,
    left_to_sell       NUMERIC(78, 0) NOT NULL,
    min_fill           NUMERIC(78, 0) NOT NULL,
    expiration         BIGINT         NOT NULL,
    active             BOOLEAN        NOT NULL,
    created_block      BIGINT         NOT NULL,
    created_at         BIGINT         NOT NULL,
    updated_block      BIGINT         NOT NULL,
    updated_at         BIGINT         NOT NULL,
    PRIMARY KEY (chain_id, marketplace, listing_id)
);
CREATE INDEX listings_live ON listings (chain_id, credit_token, token_id) WHERE active AND left_to_sell > 0;

CREATE TABLE credit_transfers (
    chain_id         INTEGER        NOT NULL,
    block_number     BIGINT         NOT NULL,
    log_index        INTEGER        NOT NULL,
    batch_index      INTEGER        NOT NULL,
    tx_hash          BYTEA          NOT NULL,
    block_timestamp  BIGINT         NOT NULL,
    credit_token     TEXT           NOT NULL,
    token_id         NUMERIC(78, 0) NOT NULL,
    sender           TEXT           NOT NULL,
    receiver         TEXT           NOT NULL,
    amount           NUMERIC(78, 0) NOT NULL,
    PRIMARY KEY (chain_id, block_number, log_index, batch_index)
);
CREATE INDEX credit_transfers_token ON credit_transfers (chain_id, credit_token, token_id, block_number, log_index);
CREATE INDEX credit_transfers_receiver ON credit_transfers (chain_id, credit_token, token_id, receiver);

CREATE INDEX retirements_listing ON retirements (chain_id, block_timestamp DESC, tx_hash, retirement_index);

CREATE TABLE api_keys (
    id          BIGSERIAL   PRIMARY KEY,
    -- sha256 of the whole bearer token; the token itself is shown once and never stored
    key_hash    BYTEA       NOT NULL UNIQUE,
    prefix      TEXT        NOT NULL,
    name        TEXT        NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);
CREATE INDEX api_keys_prefix ON api_keys (prefix);

CREATE TABLE quotes (
    uuid            UUID           PRIMARY KEY,
    api_key_id      BIGINT         NOT NULL REFERENCES api_keys (id),
    chain_id        INTEGER        NOT NULL,
    marketplace     TEXT           NOT NULL,
    listing_id      NUMERIC(78, 0) NOT NULL,
    quantity_units  NUMERIC(78, 0) NOT NULL,
    unit_price      NUMERIC(78, 0) NOT NULL,
    cost_usdc       NUMERIC(78, 0) NOT NULL,
    created_at      BIGINT         NOT NULL,
    expires_at      BIGINT         NOT NULL,
    consumed_at     BIGINT
);

CREATE TABLE orders (
    id                    UUID        PRIMARY KEY,
    quote_uuid            UUID        NOT NULL UNIQUE REFERENCES quotes (uuid),
    api_key_id            BIGINT      NOT NULL REFERENCES api_keys (id),
    job_id                BIGINT      REFERENCES relay_jobs (id),
    beneficiary_name      TEXT        NOT NULL,
    beneficiary_address   TEXT        NOT NULL,
    retirement_message    TEXT        NOT NULL,
    consumption_metadata  JSONB,
    error                 JSONB,
    created_at            BIGINT      NOT NULL,
    updated_at            BIGINT      NOT NULL
);
CREATE INDEX orders_job ON orders (job_id);
