-- Issue 18. Every executor nonce is accounted for. When the chain's nonce passes a journaled
-- transaction that did not mine, the follower finds what took its nonce: one of ours (a
-- replacement at the same nonce, recorded mined) or a transaction not in the journal (the
-- executor key used elsewhere: its job is signed again at a new nonce, or ends). Either way
-- the transactions left at that nonce will never mine: passed_at says since when, and they
-- are no longer live (re-sent, looked for, counted in flight). This replaces the one-day
-- window of the live journal: a transaction stays live until its nonce is passed.

ALTER TABLE relay_transactions ADD COLUMN passed_at TIMESTAMPTZ;
DROP INDEX relay_transactions_lane;
CREATE INDEX relay_transactions_lane ON relay_transactions (chain_id, executor, nonce)
    WHERE mined_block IS NULL AND passed_at IS NULL;
-- Every transaction at one nonce of a lane (mined, replaced or passed ones too).
CREATE INDEX relay_transactions_nonce ON relay_transactions (chain_id, executor, nonce);
