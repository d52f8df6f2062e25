"""The payments wing: money that comes to the operator by x402 (design: docs/design/x402-v2.md).

- :mod:`~relayer.service.payments.facilitator`: the standard facilitator (verify and settle
  ``exact`` payments for any resource server) over the relay.
- :mod:`~relayer.service.payments.resource`: ``actions/retire`` as a standard x402 resource,
  composed of :mod:`~relayer.service.payments.offer` (the 402 and its quote reference),
  :mod:`~relayer.service.payments.take` (a paid request), :mod:`~relayer.service.payments.drive`
  (the payment's states), :mod:`~relayer.service.payments.retire` (the treasury's retirement)
  and :mod:`~relayer.service.payments.refund`; :mod:`~relayer.service.payments.quotes` holds
  the derived keys, quote references and the treasury's ledger.

The wire every unit reads and writes is :mod:`relayer.domain.x402_wire`; the payment's states
are :mod:`relayer.domain.payment_states`. The relay core never imports this room (an import
contract)."""
