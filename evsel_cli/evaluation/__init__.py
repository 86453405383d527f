"""Evaluation harness: real benchmark data through evsel's own parsers and chunker, every
selector by name, recall/MRR and answer metrics, tables, JSON and plots (`evsel eval`)."""

from .datasets import ADAPTERS, EvalDataset, EvalQuestion, default_data_dir, load_dataset
from .gold import Gold, resolve
from .runner import EvalConfig, run

__all__ = ["ADAPTERS", "EvalConfig", "EvalDataset", "EvalQuestion", "Gold", "default_data_dir", "load_dataset",
           "resolve", "run"]
