"""The reader: the answer's exact words found in the shown passages (the span head, the LoRA reader)."""
