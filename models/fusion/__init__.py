"""The learned fusion of BM25 with the LLM's signals (hybrid) and the paired test that decides a kind's
default method."""
