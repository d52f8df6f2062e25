-- Issue 19, part 4. The retirement endpoint as a standard x402 resource (design C4-C6): a
-- payment is a payer's EIP-3009 transfer to the operator's treasury, pulled by a 'transfer' relay
-- job, then a retirement relayed from the treasury (a treasury-signed retirement job whose salt
-- derives from the payment id), or, when the retirement can never execute, a refund (a
-- treasury-signed transfer back to the payer whose EIP-3009 nonce derives from the payment id).
-- quote_id UNIQUE makes a quote reference single-use; (chain_id, payer, auth_nonce) UNIQUE makes
-- one authorization one payment. The row is recorded before its transfer job (transfer_job_id
-- NULL until linked), with the signed payload, so the payment keeper can finish a payment whose
-- process died between the two. States: accepted (recorded; transfer on its way) -> paid (the
-- funds are in the treasury: our transfer confirmed, or another sender used the authorization:
-- payment_tx) -> retiring (retire_job_id) -> retired; paid/retiring -> refunding (refund_job_id)
-- -> refunded; accepted -> failed (the transfer never happened: nothing was charged).
CREATE TABLE x402_payments (
    id                 UUID PRIMARY KEY,
    chain_id           INTEGER NOT NULL,
    quote_id           TEXT    NOT NULL UNIQUE,
    request_hash       BYTEA   NOT NULL,
    request            JSONB   NOT NULL,
    payload            JSONB   NOT NULL,
    payload_hash       BYTEA   NOT NULL,
    payer              TEXT    NOT NULL,
    auth_nonce         BYTEA   NOT NULL,
    amount             NUMERIC(78, 0) NOT NULL CHECK (amount > 0),
    transfer_job_id    BIGINT  REFERENCES relay_jobs (id),
    payment_tx         BYTEA,
    retire_job_id      BIGINT  REFERENCES relay_jobs (id),
    refund_job_id      BIGINT  REFERENCES relay_jobs (id),
    refund_valid_before BIGINT,
    state              TEXT    NOT NULL CHECK (state IN ('accepted', 'paid', 'retiring', 'retired',
                                                         'refunding', 'refunded', 'failed')),
    error              JSONB,
    created_at         BIGINT  NOT NULL,
    updated_at         BIGINT  NOT NULL,
    UNIQUE (chain_id, payer, auth_nonce)
);
-- The payment keeper's work: payments not yet final, oldest first.
CREATE INDEX x402_payments_open ON x402_payments (created_at)
    WHERE state IN ('accepted', 'paid', 'retiring', 'refunding');
