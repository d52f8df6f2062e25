-- Executor leases that fence: whoever takes a key's lease bumps its epoch, and every signing
-- transaction checks (with the row locked for share) that the epoch is still its own, so a
-- process that lost its lease without knowing it (its session dropped, another took over)
-- cannot sign another transaction from that key.
-- depends: 0003_chain_identity

CREATE TABLE executor_leases (
    chain_id  INTEGER     NOT NULL,
    executor  TEXT        NOT NULL,
    epoch     BIGINT      NOT NULL,
    holder    TEXT        NOT NULL,
    taken_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, executor)
);
