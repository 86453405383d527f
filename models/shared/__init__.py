"""Machinery the methods share and none of them owns: the block-sparse prompt and encoders, LoRA
adapters, QRRanker's head lists, the caches, per-chunk state cache and trained-file readers."""
