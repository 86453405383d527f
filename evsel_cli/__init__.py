"""evsel: ask questions about long documents with evidence chosen by the answering LLM."""

__version__ = "0.1.0"
