"""QRRanker (seed 003): listwise reranking by query-focused heads, its per-chunk KV files and the
memory prefix of summaries."""
