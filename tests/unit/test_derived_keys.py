"""The keys a treasury retirement derives from its order's or payment's id
(:mod:`relayer.service.treasury`) are the bytes every release has stored: a change of form
would orphan the salts, request keys and refund nonces of orders and payments in flight."""

from __future__ import annotations

import uuid

from eth_utils.crypto import keccak

from relayer.service.market.orders import order_request_key, order_salt
from relayer.service.payments.quotes import payment_request_key, payment_salt, refund_nonce

ID = uuid.UUID("0b9c6a43-8d34-4bb6-9d1c-6f2e0a7f5c11")


def test_each_key_is_keccak_of_its_purpose_and_the_id() -> None:
    def old(tag: bytes) -> bytes:
        return keccak(tag + ID.bytes)

    assert order_salt(ID) == old(b"relayer/marketplace-order/salt/v1")
    assert order_request_key(ID) == old(b"relayer/marketplace-order/request/v1")
    assert payment_salt(ID) == old(b"relayer/x402-payment/salt/v1")
    assert payment_request_key(ID) == old(b"relayer/x402-payment/request/v1")
    assert refund_nonce(ID) == old(b"relayer/x402-refund/v1")


def test_the_keys_of_one_id_differ_and_the_same_purpose_of_two_ids_differ() -> None:
    keys = [f(ID) for f in (order_salt, order_request_key, payment_salt, payment_request_key, refund_nonce)]
    assert len(set(keys)) == 5 and all(len(k) == 32 for k in keys)
    assert payment_salt(ID) != payment_salt(uuid.UUID(int=ID.int ^ 1))
