-- Issue 17. One word for the 32-byte nonce that binds a retirement and its salt
-- (keccak256(abi.encode(hashRetirement(r), salt))): the bound nonce, in every table.
ALTER TABLE relay_jobs RENAME COLUMN auth_key TO bound_nonce;
ALTER TABLE retirements RENAME COLUMN authorization_nonce TO bound_nonce;
ALTER INDEX retirements_authorization_nonce RENAME TO retirements_bound_nonce;
