-- Initial schema of the relay: jobs and their state, spent salts, every signed
-- transaction (raw bytes committed before broadcast), executor nonces, indexed
-- retirements and the indexer's cursor. Money is NUMERIC(78,0) atomic units.
-- depends:

CREATE TABLE relay_jobs (
    id               BIGSERIAL PRIMARY KEY,
    chain_id         INTEGER     NOT NULL,
    -- keccak256(abi.encode(hashRetirement(r), salt)): the EIP-3009 nonce for USDC, and
    -- for kVCM the value whose high 192 bits the permit deadline carries
    auth_key         BYTEA       NOT NULL,
    -- kVCM only: keccak256(token, owner, permit nonce); one live job per permit nonce
    permit_key       BYTEA,
    salt             BYTEA       NOT NULL,
    scheme           TEXT        NOT NULL CHECK (scheme IN ('eip3009', 'eip2612')),
    payer            TEXT        NOT NULL,
    input_token      TEXT        NOT NULL,
    auth_value       NUMERIC(78, 0) NOT NULL,
    -- unix seconds after which the authorization is no longer valid (never signed past it)
    auth_expires_at  BIGINT      NOT NULL,
    gas_allowance    NUMERIC(78, 0) NOT NULL,
    request_hash     BYTEA       NOT NULL,
    settlement       TEXT        NOT NULL,
    call_data        BYTEA       NOT NULL,
    summary          JSONB       NOT NULL,
    state            TEXT        NOT NULL CHECK (state IN ('accepted', 'simulated', 'signed', 'submitted',
                                   'mined', 'confirmed', 'indexed', 'rejected', 'reverted')),
    error            JSONB,
    gas_limit        BIGINT,
    max_fee_per_gas  NUMERIC(78, 0),
    max_priority_fee_per_gas NUMERIC(78, 0),
    executor         TEXT,
    executor_nonce   BIGINT,
    tx_hash          BYTEA,
    block_number     BIGINT,
    block_hash       BYTEA,
    attempts         INTEGER     NOT NULL DEFAULT 1,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    accepted_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    simulated_at     TIMESTAMPTZ,
    signed_at        TIMESTAMPTZ,
    submitted_at     TIMESTAMPTZ,
    mined_at         TIMESTAMPTZ,
    confirmed_at     TIMESTAMPTZ,
    indexed_at       TIMESTAMPTZ,
    UNIQUE (chain_id, auth_key)
);
CREATE INDEX relay_jobs_open ON relay_jobs (state) WHERE state IN ('simulated', 'signed', 'submitted', 'mined', 'confirmed');
CREATE INDEX relay_jobs_tx_hash ON relay_jobs (tx_hash);
-- A permit nonce can be spent once: at most one job that may still spend it. A rejected
-- (nothing signed) or reverted (nothing spent) job frees it for a new request.
CREATE UNIQUE INDEX relay_jobs_live_permit ON relay_jobs (chain_id, permit_key)
    WHERE permit_key IS NOT NULL AND state NOT IN ('rejected', 'reverted');

CREATE TABLE spent_salts (
    chain_id   INTEGER     NOT NULL,
    salt       BYTEA       NOT NULL,
    job_id     BIGINT      NOT NULL REFERENCES relay_jobs (id),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, salt)
);

CREATE TABLE relay_transactions (
    tx_hash                  BYTEA       PRIMARY KEY,
    job_id                   BIGINT      NOT NULL REFERENCES relay_jobs (id),
    chain_id                 INTEGER     NOT NULL,
    executor                 TEXT        NOT NULL,
    nonce                    BIGINT      NOT NULL,
    raw_tx                   BYTEA       NOT NULL,
    gas_limit                BIGINT      NOT NULL,
    max_fee_per_gas          NUMERIC(78, 0) NOT NULL,
    max_priority_fee_per_gas NUMERIC(78, 0) NOT NULL,
    created_at               TIMESTAMPTZ NOT NULL DEFAULT now(),
    broadcast_at             TIMESTAMPTZ
);
CREATE INDEX relay_transactions_job ON relay_transactions (job_id);

CREATE TABLE executor_nonces (
    chain_id   INTEGER     NOT NULL,
    executor   TEXT        NOT NULL,
    next_nonce BIGINT      NOT NULL CHECK (next_nonce >= 0),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, executor)
);

CREATE TABLE retirements (
    chain_id          INTEGER     NOT NULL,
    tx_hash           BYTEA       NOT NULL,
    retirement_index  INTEGER     NOT NULL,
    block_number      BIGINT      NOT NULL,
    block_hash        BYTEA       NOT NULL,
    log_index         INTEGER     NOT NULL,
    block_timestamp   BIGINT      NOT NULL,
    payer             TEXT        NOT NULL,
    beneficiary       TEXT        NOT NULL,
    input_token       TEXT        NOT NULL,
    value             NUMERIC(78, 0) NOT NULL,
    fee               NUMERIC(78, 0) NOT NULL,
    retirement_cost   NUMERIC(78, 0) NOT NULL,
    refunded          NUMERIC(78, 0) NOT NULL,
    gas_allowance     NUMERIC(78, 0) NOT NULL,
    source            SMALLINT    NOT NULL,
    source_id         NUMERIC(78, 0) NOT NULL,
    credit_token      TEXT        NOT NULL,
    token_id          NUMERIC(78, 0) NOT NULL,
    amount_units      NUMERIC(78, 0) NOT NULL,
    project_id        TEXT        NOT NULL,
    vintage           INTEGER     NOT NULL,
    registry          TEXT        NOT NULL,
    authorization_nonce BYTEA     NOT NULL,
    details           JSONB       NOT NULL,
    indexed_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, tx_hash, retirement_index)
);
CREATE INDEX retirements_beneficiary ON retirements (beneficiary);
CREATE INDEX retirements_authorization_nonce ON retirements (chain_id, authorization_nonce);

CREATE TABLE indexer_cursor (
    chain_id     INTEGER     NOT NULL,
    name         TEXT        NOT NULL,
    block_number BIGINT      NOT NULL,
    block_hash   BYTEA,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, name)
);
