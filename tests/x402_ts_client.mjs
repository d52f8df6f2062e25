// A standard x402 v2 client made only of the official TypeScript SDK (@x402/fetch's
// wrapFetchWithPayment, @x402/evm's exact scheme, viem's account), unmodified: it requests a
// resource, pays the 402 it gets with an EIP-3009 authorization, and prints one JSON line
//   {"status": <HTTP status>, "body": <response text>, "paymentResponse": <decoded PAYMENT-RESPONSE or null>}
// Exit code 0 whenever an answer came back (the caller judges the status), 1 on an error.
//
// Usage: node tests/x402_ts_client.mjs <url> <method> <json body or "">
//   env X402_PRIVATE_KEY   the payer's key (0x hex)
//       X402_NETWORK       e.g. eip155:84532
//       X402_ASSET         the token the client may pay with (a devnet USDC is not a default asset)
//       X402_MAX_AMOUNT    the most it pays per request, atomic units
// Used by tests/integration/test_x402_sdk.py; the same arguments pay any x402 v2 resource
// (e.g. POST .../api/actions/retire with its JSON body).
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { privateKeyToAccount } from "viem/accounts";

const [url, method = "GET", body = ""] = process.argv.slice(2);
const need = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is required`);
  return value;
};

try {
  if (!url) throw new Error("usage: x402_ts_client.mjs <url> <method> <json body>");
  const client = new x402Client();
  registerExactEvmScheme(client, { signer: privateKeyToAccount(need("X402_PRIVATE_KEY")) });
  client.setSpendControls({
    allowedAssets: [
      { network: need("X402_NETWORK"), asset: need("X402_ASSET"), maxAmountPerPayment: need("X402_MAX_AMOUNT") },
    ],
  });
  const pay = wrapFetchWithPayment(fetch, client);
  const init = { method, signal: AbortSignal.timeout(120_000) };
  if (body) {
    JSON.parse(body); // a JSON body or nothing
    init.body = body;
    init.headers = { "content-type": "application/json" };
  }
  const response = await pay(url, init);
  const header = response.headers.get("PAYMENT-RESPONSE");
  console.log(
    JSON.stringify({
      status: response.status,
      body: await response.text(),
      paymentResponse: header ? decodePaymentResponseHeader(header) : null,
    }),
  );
} catch (error) {
  console.error(`x402_ts_client: ${error?.stack ?? error}`);
  process.exit(1);
}
