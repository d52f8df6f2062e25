-- The chain this database belongs to: its id and genesis block hash, recorded by the first
-- daemon that starts on it. A daemon whose node answers another genesis (a reset devnet,
-- another network under the same id) refuses to start instead of mixing two chains' state.
-- depends: 0002_notify_trigger

CREATE TABLE chain_identity (
    chain_id     INTEGER     PRIMARY KEY,
    genesis_hash BYTEA       NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
