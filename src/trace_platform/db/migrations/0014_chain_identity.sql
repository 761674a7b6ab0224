-- Block hashes are part of raw data's identity: a range commit records the chain it was read
-- from (chain id, its first block's hash and parent hash, its last block's hash), so a
-- completeness check can compare them with the node and tell a reorg or a reset chain.
ALTER TABLE dataset_commits ADD COLUMN chain_id BIGINT;
ALTER TABLE dataset_commits ADD COLUMN first_block_hash TEXT CHECK (first_block_hash ~ '^0x[0-9a-f]{64}$');
ALTER TABLE dataset_commits ADD COLUMN last_block_hash TEXT CHECK (last_block_hash ~ '^0x[0-9a-f]{64}$');
ALTER TABLE dataset_commits ADD COLUMN parent_hash TEXT CHECK (parent_hash ~ '^0x[0-9a-f]{64}$');
