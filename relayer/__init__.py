"""The gasless relay executor for carbon retirement on Base (see README.md and docs/)."""

import os

# keccak256 (EIP-712 digests, bound nonces, transaction hashes, checksummed addresses) through
# eth-hash's pysha3 backend, a C extension (safe-pysha3, a dependency): eth-hash otherwise
# picks pycryptodome, about ten times its cost a call. An operator's own ETH_HASH_BACKEND
# stands. eth-hash reads it at its first hash, after this package is imported.
os.environ.setdefault("ETH_HASH_BACKEND", "pysha3")
