-- Issue 35. A payment is what the chain proves. A payment is paid only once the chain holds the
-- token's AuthorizationUsed(payer, nonce) and Transfer(payer, treasury, value) logs of one
-- transaction (relayer/domain/proof.py): payment_tx names that transaction and received the
-- value it moved (atomic USDC). A payment that is paid, retiring, retired, refunding or refunded
-- always has both (checked from now on; NOT VALID leaves rows of older releases as they are), so
-- a refund can only return what arrived. from_block is where the proof is searched from (the
-- head when the payment was taken, less a lookback). due_at is when the payment keeper looks at
-- the payment next (unix seconds): it takes the payments due, earliest first, and puts each off
-- after its step, so every open payment gets its turn (it took the 20 oldest before, and 20
-- payments that never closed kept every other one waiting).
-- depends: 0024_record_mined_in_one_call

ALTER TABLE x402_payments ADD COLUMN IF NOT EXISTS from_block BIGINT;
ALTER TABLE x402_payments ADD COLUMN IF NOT EXISTS received NUMERIC(78, 0);
ALTER TABLE x402_payments ADD COLUMN IF NOT EXISTS due_at BIGINT;
UPDATE x402_payments SET due_at = created_at WHERE due_at IS NULL;
ALTER TABLE x402_payments ALTER COLUMN due_at SET NOT NULL;
ALTER TABLE x402_payments ADD CONSTRAINT x402_payments_paid_is_proven CHECK (
    state IN ('accepted', 'failed')
    OR (payment_tx IS NOT NULL AND octet_length(payment_tx) = 32 AND received IS NOT NULL AND received > 0)
) NOT VALID;
ALTER TABLE x402_payments ADD CONSTRAINT x402_payments_refund_within_received CHECK (
    refund_job_id IS NULL OR (received IS NOT NULL AND received > 0)
) NOT VALID;

DROP INDEX IF EXISTS x402_payments_open;
CREATE INDEX IF NOT EXISTS x402_payments_due ON x402_payments (due_at)
    WHERE state IN ('accepted', 'paid', 'retiring', 'refunding');
