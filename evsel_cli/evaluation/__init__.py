"""Evaluation harness: real benchmark data through evsel's own parsers and chunker, every
selector by name, recall/MRR and answer metrics, tables, JSON and plots (`evsel eval`)."""
