"""llama-cpp-python as the generator: the GGUF file run quantized, for generation only.

Everything that reads hidden states (selectors, training) stays on the transformers copy. The
prompt is tokenized by the backbone's own (transformers) tokenizer and decoded by it, and the
greedy loop with the repetition penalty is the one transformers runs, so both backends see the
same tokens and follow the same decoding rule; only the arithmetic differs (quantized weights
here, bf16 of the dequantized weights there).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from evsel.errors import ModelError

FIRST_CONTEXT = 4096  # tokens of KV cache allocated first; grown (a reload, ~0.1 s) when a prompt needs more
BATCH = 512  # prompt tokens per llama_decode call


def importable() -> tuple[bool, str]:
    """Whether `llama_cpp` imports here, and if not, why (the exception, in one line)."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as exc:  # noqa: BLE001  ImportError, or OSError from a shared library that fails to load
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return True, ""


def version() -> str | None:
    try:
        import llama_cpp
    except Exception:  # noqa: BLE001  reported as not importable elsewhere
        return None
    return getattr(llama_cpp, "__version__", "?")


_LOG_CALLBACK = None  # kept alive: llama.cpp holds a pointer to it


def _silence_llama_log() -> None:
    """llama.cpp logs to stderr even with verbose=False (e.g. about its SWA cache); evsel's stderr
    is for its own progress and errors."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None:
        return
    import ctypes

    import llama_cpp

    @llama_cpp.llama_log_callback
    def ignore(_level, _text, _user_data):
        return None

    llama_cpp.llama_log_set(ignore, ctypes.c_void_p(0))
    _LOG_CALLBACK = ignore


def _train_context(llm) -> int:
    import llama_cpp

    return int(llama_cpp.llama_model_n_ctx_train(llm.model)) or llm.n_ctx()


class LlamaCppGenerator:
    """One GGUF file loaded by llama.cpp (mmap: the quantized weights, no dense copy)."""

    def __init__(self, path: Path, threads: int | None = None):
        self.path = Path(path)
        self.threads = threads
        self._llm = None
        self._n_ctx = 0
        self._lock = threading.Lock()
        self.load_seconds = 0.0

    @property
    def loaded(self) -> bool:
        return self._llm is not None

    @property
    def n_threads(self) -> int:
        """EVSEL_THREADS, else one per core (llama.cpp's own default is half the cores)."""
        import os

        return self.threads or os.cpu_count() or 1

    def load(self, n_ctx: int = FIRST_CONTEXT):
        """The llama.cpp model with a KV cache of at least `n_ctx` tokens (capped at the training
        context)."""
        if self._llm is not None and self._n_ctx >= n_ctx:
            return self._llm
        with self._lock:
            if self._llm is not None and self._n_ctx >= n_ctx:
                return self._llm
            from llama_cpp import Llama

            _silence_llama_log()
            started = time.perf_counter()
            old, self._llm = self._llm, None
            if old is not None:
                old.close()
            threads = self.n_threads
            try:
                llm = Llama(model_path=str(self.path), n_ctx=max(n_ctx, FIRST_CONTEXT), n_batch=BATCH,
                            n_ubatch=BATCH, n_threads=threads, n_threads_batch=threads, verbose=False)
            except Exception as exc:  # llama.cpp raises ValueError for files it cannot load
                raise ModelError(f"llama.cpp cannot load {self.path}: {exc}",
                                 "set EVSEL_GENERATOR=transformers to generate with transformers") from exc
            train = _train_context(llm)
            if llm.n_ctx() > train:  # never more cache than the model was trained for
                llm.close()
                llm = Llama(model_path=str(self.path), n_ctx=train, n_batch=BATCH, n_ubatch=BATCH,
                            n_threads=threads, n_threads_batch=threads, verbose=False)
            self._llm, self._n_ctx = llm, llm.n_ctx()
            self.load_seconds += time.perf_counter() - started
            return llm

    def context_length(self) -> int:
        """The model's training context (the prompt + answer limit)."""
        return _train_context(self.load())

    def stop_ids(self) -> set[int]:
        """End-of-generation tokens by the GGUF's own vocabulary (EOS and EOT)."""
        import llama_cpp

        llm = self.load()
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        ids = {llm.token_eos(), llama_cpp.llama_vocab_eot(vocab)}
        return {i for i in ids if i is not None and i >= 0}

    def describe(self) -> dict:
        """Shape of the model from the GGUF metadata, as `models info` shows it."""
        import llama_cpp

        llm = self.load()
        meta = llm.metadata
        arch = meta.get("general.architecture", "")

        def field(name):
            value = meta.get(f"{arch}.{name}")
            return int(value) if value not in (None, "") else None

        return {
            "layers": field("block_count"),
            "hidden_size": field("embedding_length"),
            "attention_heads": field("attention.head_count"),
            "kv_heads": field("attention.head_count_kv") or field("attention.head_count"),
            "context": _train_context(llm),
            "parameters": int(llama_cpp.llama_model_n_params(llm.model)),
        }

    def generate(self, prompt_ids: list[int], max_new_tokens: int, repetition_penalty: float,
                 stop_ids: set[int], stop=None) -> tuple[list[int], dict]:
        """Greedy continuation of `prompt_ids`; transformers' repetition penalty (every token of
        prompt and answer so far: positive logits divided by it, negative ones multiplied).
        `stop(new_ids)` may end it early. Returns (new ids, {"prefill_s", "decode_s", "ended"}),
        `ended` when an end token stopped it (that token is not among the new ids)."""
        import llama_cpp
        import numpy as np

        needed = len(prompt_ids) + max_new_tokens
        llm = self.load(needed)
        if needed > llm.n_ctx():
            raise ModelError(f"the prompt has {len(prompt_ids)} tokens, more than the model's "
                             f"{llm.n_ctx()}-token window allows", "use a smaller --top-n")
        n_vocab = llm.n_vocab()
        seen = np.zeros(n_vocab, dtype=bool)
        seen[np.asarray(prompt_ids, dtype=np.int64)] = True
        new: list[int] = []
        ended = False
        with self._lock:  # one sequence in the KV cache at a time
            llm.reset()
            started = time.perf_counter()
            llm.eval(prompt_ids)
            prefill = time.perf_counter() - started
            while len(new) < max_new_tokens:
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
                if repetition_penalty != 1.0:
                    logits = logits.copy()
                    hit = logits[seen]
                    logits[seen] = np.where(hit < 0, hit * repetition_penalty, hit / repetition_penalty)
                token = int(np.argmax(logits))
                if token in stop_ids:
                    ended = True
                    break
                new.append(token)
                seen[token] = True
                if stop is not None and stop(new):
                    break
                if len(new) < max_new_tokens:
                    llm.eval([token])
            decode = time.perf_counter() - started - prefill
        return new, {"prefill_s": prefill, "decode_s": decode, "ended": ended}

    def close(self) -> None:
        with self._lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None
