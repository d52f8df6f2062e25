import { wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { privateKeyToAccount } from "viem/accounts";

const LOCAL_USDC = "0x5FbDB2315678afecb367f642d76aa5f3f6d1e6a5";
const pr = {
  x402Version: 2, error: "Payment required",
  resource: { url: "http://127.0.0.1:8402/api/actions/retire", mimeType: "application/json" },
  accepts: [{ scheme: "exact", network: "eip155:84532", amount: "2500000", asset: LOCAL_USDC,
    payTo: "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", maxTimeoutSeconds: 300,
    extra: { name: "USDC", version: "2", quoteRef: "q_0123456789abcdef0123" } }],
  extensions: { "payment-identifier": { info: { required: false }, schema: { type: "object" } } },
};
const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64");
const seen = [];
const fakeFetch = async (req) => {
  const body = await req.clone().text();
  seen.push({ method: req.method, headers: Object.fromEntries(req.headers), body });
  if (!req.headers.get("PAYMENT-SIGNATURE"))
    return new Response(JSON.stringify({ error: "payment_required" }), { status: 402, headers: { "PAYMENT-REQUIRED": b64(pr), "content-type": "application/json" } });
  const settle = { success: true, transaction: "0x" + "ab".repeat(32), network: "eip155:84532", payer: "0x0" };
  return new Response(JSON.stringify({ status: "settled" }), { status: 200, headers: { "PAYMENT-RESPONSE": b64(settle) } });
};
const account = privateKeyToAccount("0x" + "11".repeat(32));
async function run(label, controls) {
  const client = new x402Client();
  registerExactEvmScheme(client, { signer: account });
  if (controls !== undefined) client.setSpendControls(controls);
  const pay = wrapFetchWithPayment(fakeFetch, client);
  seen.length = 0;
  try {
    const r = await pay("http://127.0.0.1:8402/api/actions/retire", { method: "POST", body: JSON.stringify({ action: "actions/retire", amount: "1" }), headers: { "content-type": "application/json" } });
    console.log(`[${label}] status`, r.status, "requests", seen.length, "second body", seen[1]?.body);
    const sig = JSON.parse(Buffer.from(seen[1].headers["payment-signature"], "base64").toString());
    console.log(JSON.stringify(sig, null, 1));
  } catch (e) { console.log(`[${label}]`, e.message); }
}
await run("default controls");
await run("allowedAssets", { allowedAssets: [{ network: "eip155:84532", asset: LOCAL_USDC, maxAmountPerPayment: "100000000" }] });
