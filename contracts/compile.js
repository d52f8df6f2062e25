// Compiles contracts/src with solc (pinned in package.json) through the standard-JSON API
// and writes one artifact per deployable contract to contracts_abi/<Name>.json
// ({contractName, abi, bytecode}; the OVERRIDES' also carry their runtime code,
// deployedBytecode). `--check` compiles in memory and exits 1 when the committed artifacts
// differ from a fresh compile.
"use strict";
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const ROOT = path.resolve(__dirname, "..");
const SRC = path.join(__dirname, "src");
const OUT = path.join(ROOT, "contracts_abi");
const DEPLOYABLE = [
  "UsdcEip3009", "KlimaVcm", "CarbonCredits", "CarbonClasses",
  "UsdcKvcmPool", "Marketplace", "RetirementSettlement", "GasPriceOracleDev", "EthUsdFeedDev",
];
// Never deployed: placed at an address for one eth_call by a state override, so their
// artifacts also carry the runtime code (deployedBytecode).
const OVERRIDES = ["BatchProber"];

function findImports(importPath) {
  const candidate = path.join(ROOT, "node_modules", importPath);
  if (fs.existsSync(candidate)) return { contents: fs.readFileSync(candidate, "utf8") };
  return { error: `import not found: ${importPath}` };
}

function compile() {
  const sources = {};
  for (const file of fs.readdirSync(SRC).sort()) {
    if (file.endsWith(".sol")) sources[file] = { content: fs.readFileSync(path.join(SRC, file), "utf8") };
  }
  const input = {
    language: "Solidity",
    sources,
    settings: {
      evmVersion: "cancun",
      viaIR: true,
      optimizer: { enabled: true, runs: 200 },
      metadata: { bytecodeHash: "none", appendCBOR: false },
      outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImports }));
  const errors = (output.errors || []).filter((e) => e.severity === "error");
  for (const e of output.errors || []) process.stderr.write(e.formattedMessage + "\n");
  if (errors.length) process.exit(2);
  const artifacts = {};
  for (const name of [...DEPLOYABLE, ...OVERRIDES]) {
    const c = output.contracts[`${name}.sol`][name];
    const artifact = { contractName: name, compiler: `solc-${solc.version()}`, abi: c.abi, bytecode: "0x" + c.evm.bytecode.object };
    if (OVERRIDES.includes(name)) artifact.deployedBytecode = "0x" + c.evm.deployedBytecode.object;
    artifacts[name] = JSON.stringify(artifact, null, 1) + "\n";
  }
  return artifacts;
}

const artifacts = compile();
if (process.argv.includes("--check")) {
  const stale = Object.keys(artifacts).filter((name) => {
    const file = path.join(OUT, `${name}.json`);
    return !fs.existsSync(file) || fs.readFileSync(file, "utf8") !== artifacts[name];
  });
  if (stale.length) {
    process.stderr.write(`stale artifacts in contracts_abi/: ${stale.join(", ")} (run: npm run compile)\n`);
    process.exit(1);
  }
  process.stdout.write(`contracts_abi/ matches a fresh compile (${Object.keys(artifacts).length} contracts)\n`);
} else {
  fs.mkdirSync(OUT, { recursive: true });
  for (const [name, text] of Object.entries(artifacts)) fs.writeFileSync(path.join(OUT, `${name}.json`), text);
  process.stdout.write(`wrote ${Object.keys(artifacts).length} artifacts to contracts_abi/\n`);
}
