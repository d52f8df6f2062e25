"""Exercise the x402 2.25.0 Python client offline: parse a PAYMENT-REQUIRED header, sign, decode."""
import asyncio, base64, json
from eth_account import Account
from x402 import x402Client
from x402.http import x402HTTPClient
from x402.mechanisms.evm.exact import ExactEvmScheme
from x402.schemas import PaymentRequired
from x402.http.utils import encode_payment_required_header, decode_payment_signature_header

LOCAL_USDC = "0x5FbDB2315678afecb367f642d76aa5f3f6d1e6a5"  # not a default asset
TREASURY = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
acct = Account.from_key("0x" + "11" * 32)

def required(asset, amount="2500000"):
    return {
        "x402Version": 2,
        "error": "Payment required",
        "resource": {"url": "http://127.0.0.1:8402/api/actions/retire", "description": "Retire 1 t", "mimeType": "application/json"},
        "accepts": [{
            "scheme": "exact", "network": "eip155:84532", "amount": amount, "asset": asset,
            "payTo": TREASURY, "maxTimeoutSeconds": 300,
            "extra": {"name": "USDC", "version": "2", "quoteRef": "q_0123456789abcdef0123"},
        }],
        "extensions": {"payment-identifier": {"info": {"required": False}, "schema": {"type": "object"}}},
    }

async def attempt(label, pr_json, controls=None):
    c = x402Client()
    c.register("eip155:*", ExactEvmScheme(signer=acct))
    if controls is not None:
        c.set_spend_controls(controls)
    http = x402HTTPClient(c)
    header = base64.b64encode(json.dumps(pr_json).encode()).decode()
    try:
        hdrs, payload = await http.handle_402_response({"PAYMENT-REQUIRED": header}, b'{"error":"payment_required"}', pr_json["resource"]["url"])
    except Exception as e:
        print(f"[{label}] {type(e).__name__}: {e}")
        return None
    print(f"[{label}] headers: {list(hdrs)}")
    decoded = json.loads(base64.b64decode(hdrs["PAYMENT-SIGNATURE"]))
    print(json.dumps(decoded, indent=1))
    return decoded

async def main():
    # 1. body only (our current 402): no header
    c = x402Client(); c.register("eip155:*", ExactEvmScheme(signer=acct))
    try:
        await x402HTTPClient(c).handle_402_response({}, b'{"error":"payment_required","x402FacilitatorVersion":2}', "u")
    except Exception as e:
        print("[body-only 402]", type(e).__name__, e)
    # 2. local (non-default) asset, default spend controls
    await attempt("local asset, default controls", required(LOCAL_USDC))
    # 3. local asset allowed explicitly with atomic cap
    await attempt("local asset allowed", required(LOCAL_USDC), {"allowed_assets": [{"network": "eip155:84532", "asset": LOCAL_USDC, "max_amount_per_payment": "100000000"}]})
    # 4. real Base Sepolia USDC, amount above $1 with default controls
    await attempt("default asset, $2.50 > $1 cap", required("0x036CbD53842c5426634e7929541eC2318f3dCF7e"))
    await attempt("default asset, $0.50", required("0x036CbD53842c5426634e7929541eC2318f3dCF7e", "500000"))
    d = await attempt("spend_controls False", required(LOCAL_USDC), False)
    # verify signature recovers with our own code path
    from eth_account.messages import encode_typed_data
    a = d["payload"]["authorization"]
    typed = {"types": {"EIP712Domain": [{"name":"name","type":"string"},{"name":"version","type":"string"},{"name":"chainId","type":"uint256"},{"name":"verifyingContract","type":"address"}],
        "TransferWithAuthorization": [{"name":"from","type":"address"},{"name":"to","type":"address"},{"name":"value","type":"uint256"},{"name":"validAfter","type":"uint256"},{"name":"validBefore","type":"uint256"},{"name":"nonce","type":"bytes32"}]},
        "primaryType": "TransferWithAuthorization",
        "domain": {"name": "USDC", "version": "2", "chainId": 84532, "verifyingContract": LOCAL_USDC},
        "message": {"from": a["from"], "to": a["to"], "value": int(a["value"]), "validAfter": int(a["validAfter"]), "validBefore": int(a["validBefore"]), "nonce": a["nonce"]}}
    rec = Account.recover_message(encode_typed_data(full_message=typed), signature=d["payload"]["signature"])
    print("recovered", rec, "== payer", rec == acct.address, "sig bytes", (len(d["payload"]["signature"]) - 2) // 2)
    # 6. name missing from extra: does the client mutate accepted?
    pr = required("0x036CbD53842c5426634e7929541eC2318f3dCF7e", "500000"); pr["accepts"][0]["extra"] = {}
    d = await attempt("extra without name (default asset)", pr)
    pr = required(LOCAL_USDC); pr["accepts"][0]["extra"] = {}
    await attempt("extra without name (local asset)", pr, False)
    # 7. x402Version missing in header -> defaults to 2?; accepts missing
    bad = required(LOCAL_USDC); del bad["accepts"]
    await attempt("no accepts", bad, False)

asyncio.run(main())
