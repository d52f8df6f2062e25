-- Issue 35. An operator can take back a leaked API key: `relayer apikey list` shows every key
-- (never its secret) with when it was last used, `revoke` sets revoked_at (every process looks
-- keys up in this table on every request, so it takes effect at once), `rotate` makes a new key
-- with the same name, scopes, rate limit and gas budget and revokes the old one. last_used_at
-- is written at most once a minute per key and process (the hot path stays read-only).
-- depends: 0025_payments_proven

ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS last_used_at TIMESTAMPTZ;
