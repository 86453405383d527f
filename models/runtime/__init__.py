"""The frozen backbone and what runs it: the transformers wrapper, llama.cpp as a generator, torch's
CPU threads."""
