-- Issue 19. The x402 `payment-identifier` extension (x402-foundation/x402
-- specs/extensions/payment_identifier.md): a client's idempotency key, bound to the first
-- PaymentPayload seen with it. scope says whose key it is: 'facilitator:<api key id>' for
-- /facilitator/settle (a later part uses 'resource' for the retirement resource). payload_hash
-- is SHA-256 of the payload's canonical JSON: the same id with another payload is a conflict
-- (HTTP 409), never a second payment. job_id links the transfer job the payload made (NULL
-- until made; set NULL when a rejected job that signed nothing is purged); payment_id is for a
-- later part (retirement payments), no foreign key on purpose.
CREATE TABLE x402_payment_ids (
    scope        TEXT        NOT NULL,
    id           TEXT        NOT NULL CHECK (id ~ '^[A-Za-z0-9_-]{16,128}$'),
    payload_hash BYTEA       NOT NULL CHECK (length(payload_hash) = 32),
    job_id       BIGINT      REFERENCES relay_jobs (id) ON DELETE SET NULL,
    payment_id   UUID,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, id)
);
CREATE INDEX x402_payment_ids_job ON x402_payment_ids (job_id) WHERE job_id IS NOT NULL;
