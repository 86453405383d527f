"""UNREAL (seed 000): evidence selection from the frozen backbone's own states.

Index side: every chunk is encoded on its own ([BOS sink] + chunk tokens), the forward pass stops
after layer l_c, and the residual stream of the chunk's tokens (the sink left out) is mean-pooled
over L_p contiguous segments: (L_p, d) per chunk, stored fp16 in the state cache.

Query side: x_ret = [BOS sink, soft prompt, C0 = top-BM25 chunks, question, rho_1..rho_R]. The
retrieval tokens' residual states are read at the readout layers, standardized per layer,
mixed with learned alpha and mean-pooled into G groups: (G, d). A chunk's score is
MaxSim(q, k) = sum_g max_b <q_g, k_b> against its (standardized) pooled states.

Trainable: the soft prompt, rho and alpha, (R + 1) * d + |alpha| numbers; the backbone is frozen.
Standardizing (a fixed per-dimension mean and std of chunk-token states at each layer, measured
once on calibration text and stored with the adapter) is our addition to the paper: SmolLM2's
residual stream has a few dimensions with a large shared offset (dims 247 and 507 carry most of
the mean vector from layer 10 on) that would otherwise dominate every inner product.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from evsel.errors import ModelError
from evsel.models.runtime.backbone import run_layers
from evsel.models.shared.trained_files import read_json, read_tensors, reading

ADAPTER_FILE = "adapter.safetensors"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.json"
COMMAND_FILE = "command.txt"
METHOD = "unreal"
INTRINSIC = "intrinsic"
TRAIN_COMMAND = "evsel train unreal"


@dataclass
class UnrealConfig:
    layer: int = 20  # l_c: chunk states are read after this many decoder layers
    pool: int = 7  # L_p: pooled vectors per chunk
    retrieval_tokens: int = 64  # R: learned tokens appended to the query
    groups: int = 4  # G: the R read-out states are mean-pooled into this many query vectors
    c0: int = 5  # BM25 chunks placed before the question
    c0_tokens: int = 160  # each C0 chunk is cut to this many tokens (chunks are ~140)
    readout: list[int] = field(default_factory=lambda: list(range(13, 21)))  # layers mixed by alpha
    standardize: bool = True  # per-dimension mean/std of chunk-token states (see module doc)
    tau: float = 1.0  # InfoNCE temperature
    soft_prompt_init: str = "Search"  # word whose embedding starts the soft prompt

    def __post_init__(self) -> None:
        self.readout = sorted(set(int(x) for x in self.readout))
        if self.retrieval_tokens % self.groups:
            raise ValueError(f"R={self.retrieval_tokens} is not divisible into G={self.groups} groups")
        if self.pool < 1 or self.layer < 1 or not self.readout or min(self.readout) < 1:
            raise ValueError("layer, pool and readout layers must be positive")

    @property
    def depth(self) -> int:
        """The deepest layer the query pass runs."""
        return max(self.readout)

    @property
    def stat_layers(self) -> list[int]:
        return sorted(set(self.readout) | {self.layer})

    def cache_key(self) -> str:
        """The chunk-state cache key: what the stored states depend on."""
        return state_key(self.layer, self.pool)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "UnrealConfig":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def state_key(layer: int, pool: int) -> str:
    return f"layer={layer};pool={pool}"


# ---------------------------------------------------------------------------------------------
# pooling and MaxSim (the early-stopping forward pass is evsel.models.runtime.backbone.run_layers)


def pooling_weights(lengths: list[int], width: int, n_pool: int, offset: int = 1):
    """(B, n_pool, width) averaging weights: segment j of sequence i averages its tokens
    offset + [j*T_i // n_pool, (j+1)*T_i // n_pool) (T_i = lengths[i] tokens after the sink);
    a segment left empty by a chunk shorter than n_pool takes its nearest token alone."""
    import torch

    w = torch.zeros(len(lengths), n_pool, width)
    for i, n in enumerate(lengths):
        if n < 1:
            raise ValueError("a chunk with no tokens cannot be pooled")
        for j in range(n_pool):
            lo, hi = (j * n) // n_pool, ((j + 1) * n) // n_pool
            if hi <= lo:
                lo, hi = min(lo, n - 1), min(lo, n - 1) + 1
            w[i, j, offset + lo:offset + hi] = 1.0 / (hi - lo)
    return w


def pool_states(states, lengths: list[int], n_pool: int, offset: int = 1):
    """(B, T, d) states -> (B, n_pool, d) segment means (float32), sink token(s) left out."""
    w = pooling_weights(lengths, states.shape[1], n_pool, offset).to(states.device)
    return w @ states.float()


def maxsim(queries, keys, block: int = 8192):
    """MaxSim(q, k_i) = sum_g max_b <q_g, k_i,b> for every chunk i.

    queries: (G, d) numpy; keys: (N, P, d) (numpy fp16/fp32, or torch on any device: scored
    there). Returns float32 numpy (N,). Blocked so that 10^5 chunks never materialise more than
    `block` chunks in fp32 at once."""
    import torch

    k_all = torch.as_tensor(keys)
    q = torch.as_tensor(np.asarray(queries, dtype=np.float32), device=k_all.device)  # (G, d)
    out = torch.empty(k_all.shape[0], dtype=torch.float32, device=k_all.device)
    with torch.inference_mode():
        for at in range(0, k_all.shape[0], block):
            k = k_all[at:at + block].float()  # (n, P, d)
            sims = torch.matmul(k, q.T)  # (n, P, G)
            out[at:at + block] = sims.amax(dim=1).sum(dim=1)
    return out.cpu().numpy()


def maxsim_torch(queries, keys):
    """Differentiable MaxSim: queries (B, G, d), keys (M, P, d) -> (B, M)."""
    import torch

    sims = torch.einsum("bgd,mpd->bmgp", queries, keys)
    return sims.amax(dim=-1).sum(dim=-1)


# ---------------------------------------------------------------------------------------------
# index side


class ChunkEncoder:
    """Encodes chunk texts independently with the frozen backbone, several layers in one pass."""

    def __init__(self, backbone, layers: list[int], pool: int, batch_tokens: int = 2560, compiled: bool = False):
        """`compiled`: run the layers through torch.compile (`Backbone.compiled_layers`); states
        then differ from eager ones within bf16 rounding (tests/test_unreal.py pins the tolerance)."""
        self.backbone = backbone
        self.compiled = compiled
        self.layers = sorted(set(layers))
        self.pool = pool
        self.batch_tokens = batch_tokens  # ~16 chunks of 160 tokens
        self.encoded_tokens = 0
        self.seconds = 0.0

    def encode(self, texts: list[str]) -> dict[int, np.ndarray]:
        """{layer: (N, pool, d) float16} in the order of `texts`."""
        import torch

        if not texts:
            return {layer: np.zeros((0, self.pool, 0), np.float16) for layer in self.layers}
        started = time.perf_counter()
        model = self.backbone.model
        ids = self.backbone.text_ids(texts)
        d = model.config.hidden_size
        out = {layer: np.zeros((len(texts), self.pool, d), np.float16) for layer in self.layers}
        import contextlib

        compiled = self.backbone.compiled_layers() if self.compiled else contextlib.nullcontext()
        with torch.inference_mode(), compiled:
            for batch, lengths, x in self.backbone.sink_batches(ids, self.batch_tokens):
                states = run_layers(model, self.layers, input_ids=x)
                for layer in self.layers:
                    pooled = pool_states(states[layer], lengths, self.pool).cpu().numpy()
                    out[layer][batch] = pooled.astype(np.float16)
                self.encoded_tokens += sum(lengths) + len(batch)
        self.seconds += time.perf_counter() - started
        return out


def chunk_states(backbone, states, chunks, layer: int, pool: int, on_event=None,
                 extra_layers: list[int] = (), batch: int = 64) -> np.ndarray:
    """(N, pool, d) float16 states of `chunks` at `layer`, from the state cache `states` or encoded
    now. `extra_layers` are encoded in the same pass and cached too (for layer sweeps)."""
    layers = sorted({layer, *extra_layers})
    encoder = ChunkEncoder(backbone, layers, pool)

    def encode(texts):
        produced = encoder.encode(texts)
        return {state_key(lay, pool): produced[lay] for lay in layers}

    got = states.ensure(backbone.fingerprint, METHOD, [state_key(lay, pool) for lay in layers],
                        chunks, encode, on_event, label=f"UNREAL chunk states (layer {layer})", batch=batch)
    return got[state_key(layer, pool)]


# ---------------------------------------------------------------------------------------------
# the adapter: the only trained part


def _torch_module():
    import torch

    class UnrealAdapter(torch.nn.Module):
        """Soft prompt (1, d), retrieval tokens rho (R, d), layer weights alpha (|readout|,),
        and fixed standardization statistics (|stat layers|, 2, d) (mean, std)."""

        def __init__(self, config: UnrealConfig, hidden: int):
            super().__init__()
            self.config = config
            self.hidden = hidden
            self.soft_prompt = torch.nn.Parameter(torch.zeros(1, hidden))
            self.rho = torch.nn.Parameter(torch.zeros(config.retrieval_tokens, hidden))
            alpha = torch.zeros(len(config.readout))
            if config.layer in config.readout:  # start from same-layer matching
                alpha[config.readout.index(config.layer)] = 1.0
            else:
                alpha[:] = 1.0 / len(config.readout)
            self.alpha = torch.nn.Parameter(alpha)
            stats = torch.zeros(len(config.stat_layers), 2, hidden)
            stats[:, 1] = 1.0
            self.register_buffer("stats", stats)

        def trainable(self):
            return [self.soft_prompt, self.rho, self.alpha]

        def _tensors(self) -> dict:
            """What `save` writes: every tensor as contiguous float32 on the CPU."""
            return {name: getattr(self, name).detach().float().cpu().contiguous()
                    for name in ("soft_prompt", "rho", "alpha", "stats")}

        def digest(self) -> str:
            """sha256 of the trained tensors and the statistics: identifies the adapter in caches
            of what it computed (a scope's keys), wherever it lives."""
            return hashlib.sha256(b"".join(t.numpy().tobytes() for t in self._tensors().values())).hexdigest()

        def n_trainable(self) -> int:
            return sum(p.numel() for p in self.trainable())

        def layer_stats(self, layer: int):
            index = self.config.stat_layers.index(layer)
            return self.stats[index, 0], self.stats[index, 1]

        def init_from_backbone(self, backbone, seed: int = 0) -> None:
            """Soft prompt = the embedding of a word; rho = the mean token embedding plus small
            noise, so each retrieval token starts as an 'average word'."""
            emb = backbone.model.model.embed_tokens.weight.detach().float()
            word = backbone.tokenizer(self.config.soft_prompt_init, add_special_tokens=False)["input_ids"]
            gen = torch.Generator().manual_seed(seed)  # drawn on the CPU: the same start on every device
            with torch.no_grad():
                self.soft_prompt.copy_(emb[word].mean(0, keepdim=True))
                noise = torch.randn(self.rho.shape, generator=gen).to(emb.device) * emb.std(0)
                self.rho.copy_(emb.mean(0, keepdim=True) + 0.1 * noise)

        def save(self, directory: Path, metrics: dict | None = None, command: str | None = None,
                 extra: dict | None = None) -> Path:
            from safetensors.torch import save_file

            directory = Path(directory)
            directory.mkdir(parents=True, exist_ok=True)
            save_file(self._tensors(), str(directory / ADAPTER_FILE))
            meta = {"method": METHOD, "hidden": self.hidden, "config": self.config.to_dict(),
                    "trainable_parameters": self.n_trainable(), **(extra or {})}
            (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            if metrics is not None:
                (directory / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
            if command is not None:
                (directory / COMMAND_FILE).write_text(command.rstrip() + "\n")
            return directory

    return UnrealAdapter


def new_adapter(config: UnrealConfig, hidden: int, device: str = "cpu"):
    """A fresh adapter on `device`: the backbone's (`backbone.plan.device`), where the query pass
    reads its tensors."""
    return _torch_module()(config, hidden).to(device)


def load_adapter(directory: Path, device: str = "cpu"):
    """An adapter saved by `save` (config.json + adapter.safetensors), on `device`."""
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / ADAPTER_FILE).is_file():
        raise ModelError(f"{directory} holds no UNREAL adapter ({CONFIG_FILE} + {ADAPTER_FILE})",
                         "train one with: evsel train unreal, or give the right folder")
    meta = read_json(directory / CONFIG_FILE, "the UNREAL adapter's config", TRAIN_COMMAND)
    with reading(directory / CONFIG_FILE, "the UNREAL adapter's config", TRAIN_COMMAND):
        config = UnrealConfig.from_dict(meta["config"])
        adapter = new_adapter(config, int(meta["hidden"]), device)
    tensors = read_tensors(directory / ADAPTER_FILE, "the UNREAL adapter", TRAIN_COMMAND)
    with reading(directory / ADAPTER_FILE, "the UNREAL adapter", TRAIN_COMMAND):
        adapter.load_state_dict({k: tensors[k] for k in ("soft_prompt", "rho", "alpha", "stats")})
    adapter.meta = meta
    return adapter


def shipped_adapter_dir(fingerprint: str) -> Path:
    """Where the package keeps the trained adapter for a backbone (by fingerprint prefix)."""
    return Path(__file__).parent.parent / "adapters" / fingerprint[:16] / METHOD


def default_adapter(backbone, path: str | Path | None = None):
    """The adapter to use: `path` (the settings' EVSEL_UNREAL_ADAPTER), else the one shipped for
    this backbone. Raises a ModelError saying how to get one when there is none."""
    chosen = path
    directory = Path(chosen).expanduser() if chosen else shipped_adapter_dir(backbone.fingerprint)
    if not (directory / CONFIG_FILE).is_file():
        if chosen:
            raise ModelError(f"no UNREAL adapter in {directory}", "give a folder written by evsel train unreal")
        raise ModelError(
            f"no UNREAL adapter ships for this backbone (fingerprint {backbone.fingerprint[:16]})",
            "train one with: evsel train unreal --out DIR, then set EVSEL_UNREAL_ADAPTER=DIR/best",
        )
    return load_adapter(directory, backbone.plan.device)


def calibrate(adapter, backbone, texts: list[str], batch_tokens: int = 2560) -> None:
    """Fill the adapter's standardization statistics from chunk-token states of `texts`
    (the sink left out): per layer, per dimension mean and std."""
    import torch

    layers = adapter.config.stat_layers
    sums = {lay: torch.zeros(adapter.hidden, dtype=torch.float64) for lay in layers}
    squares = {lay: torch.zeros(adapter.hidden, dtype=torch.float64) for lay in layers}
    count = 0
    with torch.inference_mode():
        for _, lengths, x in backbone.sink_batches(backbone.text_ids(texts), batch_tokens):
            position = torch.arange(x.shape[1], device=x.device)[None]
            mask = (position >= 1) & (position <= torch.tensor(lengths, device=x.device)[:, None])  # the chunk tokens
            states = run_layers(backbone.model, layers, input_ids=x)
            for lay in layers:
                tokens = states[lay][mask].float().cpu().double()  # (n, d)
                sums[lay] += tokens.sum(0)
                squares[lay] += (tokens ** 2).sum(0)
            count += sum(lengths)
    with torch.no_grad():  # the statistics live where the adapter does (the backbone's device)
        for index, lay in enumerate(layers):
            mean = sums[lay] / count
            var = (squares[lay] / count - mean ** 2).clamp(min=1e-6)
            adapter.stats[index, 0] = mean.float().to(adapter.stats.device)
            adapter.stats[index, 1] = var.sqrt().float().to(adapter.stats.device)


# ---------------------------------------------------------------------------------------------
# query side


class UnrealQuery:
    """Builds x_ret, runs the frozen backbone, and turns retrieval-token states into (G, d)
    query vectors; scores chunk states by MaxSim."""

    def __init__(self, backbone, adapter):
        self.backbone = backbone
        self.adapter = adapter.to(backbone.plan.device)  # in place; a no-op when already there
        self.config = adapter.config

    # inputs
    def prefix_ids(self, question: str, c0_texts: list[str]) -> list[int]:
        """Token ids of the part before the retrieval tokens, soft prompt excluded:
        C0 passages (each cut to c0_tokens), then the question."""
        tok = self.backbone.tokenizer
        ids: list[int] = []
        for text in c0_texts[: self.config.c0]:
            ids += tok(text.strip() + "\n\n", add_special_tokens=False)["input_ids"][: self.config.c0_tokens]
        ids += tok(f"Question: {question.strip()}\n", add_special_tokens=False)["input_ids"]
        return ids

    def _embed_prefix(self, ids: list[int]):
        """(1, 2 + len(ids), d): [BOS sink, soft prompt, prefix tokens] as input embeddings."""
        import torch

        model = self.backbone.model
        device = self.backbone.plan.device
        dtype = model.model.embed_tokens.weight.dtype
        tokens = torch.tensor([[self.backbone.bos_id()] + ids], device=device)
        emb = model.model.embed_tokens(tokens)
        soft = self.adapter.soft_prompt.to(device=device, dtype=dtype)[None]
        return torch.cat([emb[:, :1], soft, emb[:, 1:]], dim=1)

    def _rho(self):
        model = self.backbone.model
        return self.adapter.rho.to(device=self.backbone.plan.device, dtype=model.model.embed_tokens.weight.dtype)[None]

    # read-out
    def readout(self, ids: list[int], grad: bool = False, split: bool = True):
        """Retrieval-token states of one query at the readout layers: (|readout|, R, d) float32."""
        return self.readout_batch([ids], grad, split)[0]

    def readout_batch(self, batch: list[list[int]], grad: bool = False, split: bool = True):
        """Retrieval-token states of several queries: (B, |readout|, R, d) float32.

        Sequences are right-padded into one batch. With `split` (training) the prefixes run once
        without gradients into a KV cache and only the R retrieval tokens run with gradients,
        attending to their own prefix through the padding mask (the soft prompt then gets no
        gradient); without it the whole of x_ret runs with gradients (~3x slower on CPU)."""
        import torch

        cfg = self.config
        model = self.backbone.model
        r = cfg.retrieval_tokens
        prefixes = [self._embed_prefix(ids) for ids in batch]  # each (1, n_i, d)
        lengths = [p.shape[1] for p in prefixes]
        width = max(lengths)
        device = prefixes[0].device

        def padded(tensors, total):
            out = tensors[0].new_zeros((len(tensors), total, tensors[0].shape[-1]))
            for i, t in enumerate(tensors):
                out[i, : t.shape[1]] = t[0]
            return out

        if not grad or not split:
            # one pass over [prefix_i, rho]; right padding needs no mask under the causal mask
            with torch.set_grad_enabled(grad):
                rho = self._rho()
                x = padded([torch.cat([p, rho], dim=1) for p in prefixes], width + r)
                states = run_layers(model, cfg.readout, inputs_embeds=x)
                rows = torch.stack([torch.arange(n, n + r) for n in lengths]).to(device)  # (B, R)
                picked = [states[lay][torch.arange(len(batch), device=device)[:, None], rows].float()
                          for lay in cfg.readout]  # each (B, R, d)
                return torch.stack(picked, dim=1)
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        mask = torch.zeros(len(batch), width + r, dtype=torch.long, device=device)
        for i, n in enumerate(lengths):
            mask[i, :n] = 1
        mask[:, width:] = 1
        with torch.no_grad():
            prefix = padded([p.detach() for p in prefixes], width)
            run_layers(model, [cfg.depth], inputs_embeds=prefix, cache=cache, attention_mask=mask[:, :width])
        positions = torch.stack([torch.arange(n, n + r) for n in lengths]).to(device)  # (B, R)
        rho = self._rho().expand(len(batch), -1, -1)
        states = run_layers(model, cfg.readout, inputs_embeds=rho, cache=cache, position_ids=positions,
                            attention_mask=mask)
        return torch.stack([states[lay].float() for lay in cfg.readout], dim=1)

    def query_vectors(self, readout_states):
        """(..., |readout|, R, d) -> (..., G, d): standardize per layer, mix with alpha, pool
        the R tokens into G groups of consecutive ones."""
        import torch

        cfg = self.config
        parts = []
        for index, layer in enumerate(cfg.readout):
            states = readout_states[..., index, :, :]
            if cfg.standardize:
                mean, std = self.adapter.layer_stats(layer)
                states = (states - mean) / std
            parts.append(states)
        mixed = torch.einsum("l,l...rd->...rd", self.adapter.alpha, torch.stack(parts))  # (..., R, d)
        grouped = mixed.reshape(*mixed.shape[:-2], cfg.groups, cfg.retrieval_tokens // cfg.groups, mixed.shape[-1])
        return grouped.mean(dim=-2)  # (..., G, d)

    def chunk_keys(self, states):
        """Chunk states (.., P, d) as scored: fp32 on the backbone's device, standardized with
        layer l_c's statistics."""
        import torch

        # a copy (never change the caller's states), converted where the adapter's statistics are
        keys = torch.as_tensor(states).to(device=self.adapter.stats.device, dtype=torch.float32, copy=True)
        if self.config.standardize:
            mean, std = (t.detach() for t in self.adapter.layer_stats(self.config.layer))
            keys.sub_(mean).div_(std)  # in place: a scope of 10^5 chunks is 1.6 GB in fp32
        return keys

    def encode_question(self, question: str, c0_texts: list[str]) -> np.ndarray:
        """(G, d) float32 query vectors, no gradients."""
        return self.encode_questions([(question, c0_texts)])[0]

    def encode_questions(self, items: list[tuple[str, list[str]]], batch: int = 8) -> np.ndarray:
        """(B, G, d) float32 query vectors for (question, C0 texts) pairs, in batches."""
        import torch

        out = []
        with torch.no_grad():
            for at in range(0, len(items), batch):
                ids = [self.prefix_ids(q, c0) for q, c0 in items[at:at + batch]]
                out.append(self.query_vectors(self.readout_batch(ids)).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.config.groups, self.adapter.hidden), np.float32)

    def score_keys(self, queries: np.ndarray, keys) -> np.ndarray:
        """MaxSim of (G, d) query vectors against keys made by `chunk_keys` (standardized fp32).
        Keeping a scope's keys in fp32 makes 10^5 chunks score in ~0.3 s here; converting the stored
        fp16 states on every ask took ~1.2 s."""
        return maxsim(np.asarray(queries, dtype=np.float32), keys)


# ---------------------------------------------------------------------------------------------
# the untrained floor: intrinsic retrieval (paper A.2.1)


class IntrinsicEncoder:
    """Mean-pooled attention keys per chunk and mean-pooled queries per question, per layer.

    Keys and queries are taken before RoPE (the k_proj / q_proj outputs): chunk and question are
    encoded separately at unrelated positions, so rotated vectors would mostly add noise."""

    def __init__(self, backbone, layers: list[int]):
        self.backbone = backbone
        self.layers = sorted(set(layers))

    def _capture(self, texts: list[str], which: str) -> np.ndarray:
        """(N, |layers|, width) means over each text's tokens (the sink left out)."""
        import torch

        model = self.backbone.model
        inner = model.model
        attr = "k_proj" if which == "k" else "q_proj"
        width = getattr(inner.layers[0].self_attn, attr).out_features
        out = np.zeros((len(texts), len(self.layers), width), np.float32)
        taps = {(attr, lay): getattr(inner.layers[lay - 1].self_attn, attr) for lay in self.layers}
        with torch.inference_mode():
            # 16 texts a batch, whatever their length, as the cached keys were computed (batch
            # shapes move bf16 results by an ulp)
            for batch, lengths, x in self.backbone.sink_batches(self.backbone.text_ids(texts), None, max_rows=16):
                got = run_layers(model, [self.layers[-1]], taps=taps, input_ids=x)
                for index, lay in enumerate(self.layers):
                    out[batch, index] = pool_states(got[(attr, lay)], lengths, 1)[:, 0].cpu().numpy()
        return out

    def keys(self, texts: list[str]) -> np.ndarray:
        return self._capture(texts, "k").astype(np.float16)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._capture(texts, "q")

    def layer_scores(self, query: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Per layer, per chunk: mean over query heads h of <q_h, k_(h // group)>.
        query: (|layers|, H * hd); keys: (N, |layers|, KV * hd). Returns (N, |layers|)."""
        cfg = self.backbone.model.config
        heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        hd = query.shape[-1] // heads
        q = query.reshape(len(self.layers), kv, heads // kv, hd).sum(axis=2)  # heads sharing a KV head
        k = keys.astype(np.float32).reshape(keys.shape[0], len(self.layers), kv, hd)
        return np.einsum("lkd,nlkd->nl", q, k) / heads


def intrinsic_key(layers: list[int]) -> str:
    return "keys;layers=" + ",".join(str(x) for x in sorted(set(layers)))


def intrinsic_states(backbone, states, chunks, layers: list[int], on_event=None) -> np.ndarray:
    encoder = IntrinsicEncoder(backbone, layers)
    key = intrinsic_key(layers)
    got = states.ensure(backbone.fingerprint, INTRINSIC, [key], chunks,
                        lambda texts: {key: encoder.keys(texts)}, on_event, label="intrinsic chunk keys")
    return got[key]


# ---------------------------------------------------------------------------------------------
# at ingest


def encode_at_ingest(backbone, states, chunks, adapter_path: str | None = None,
                     on_event: Callable[[dict], None] | None = None, batch: int = 64) -> int:
    """Fill the UNREAL state cache for newly stored chunks, at the l_c and L_p of the adapter that
    `evsel ask --select unreal` will use. Without an adapter for this backbone there is nothing to
    compute states for (the selector cannot run either). Returns how many chunks were encoded or
    found cached."""
    config = adapter_config(backbone, adapter_path)
    if config is None:
        return 0
    chunk_states(backbone, states, chunks, config.layer, config.pool, on_event, batch=batch)
    return len(chunks)


def ingest_state_key(backbone, adapter_path: str | None = None) -> tuple[str, str] | None:
    """(method, config) of the states ingest computes for this backbone, or None without an adapter."""
    config = adapter_config(backbone, adapter_path)
    return None if config is None else (METHOD, state_key(config.layer, config.pool))


def adapter_config(backbone, path: str | None = None) -> UnrealConfig | None:
    """The config of the adapter in use (`path`, else the shipped one), or None."""
    chosen = path
    directory = Path(chosen).expanduser() if chosen else shipped_adapter_dir(backbone.fingerprint)
    if not (directory / CONFIG_FILE).is_file():
        return None
    meta = read_json(directory / CONFIG_FILE, "the UNREAL adapter's config", TRAIN_COMMAND)
    with reading(directory / CONFIG_FILE, "the UNREAL adapter's config", TRAIN_COMMAND):
        return UnrealConfig.from_dict(meta["config"])


def param_count(config: UnrealConfig, hidden: int) -> int:
    """(R + 1) * d + |alpha|, as in the paper."""
    return (config.retrieval_tokens + 1) * hidden + len(config.readout)
