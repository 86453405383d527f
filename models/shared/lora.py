"""LoRA adapters on the attention projections, one class for every method: QRRanker's (q_proj and
k_proj of the read layers, applied inside QR scoring only) and BlockSearch's decoder (q_proj and
v_proj of every layer, read by the query block only). What tells them apart is data: an
`AdapterKind` (file format, projections, what errors call it, the command that trains one).

Neither changes the backbone's own passes: the method computes the deltas where it reads them, so
the answering path and the KV a block caches stay those of the frozen model. Files:
OUT/adapter.safetensors (the A and B matrices) and OUT/adapter.json (config, shapes, extras)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evsel.errors import ModelError
from evsel.models.shared.blocksparse import check_heads, model_device
from evsel.models.shared.trained_files import read_json, read_tensors, reading

ADAPTER_FILE = "adapter.safetensors"
ADAPTER_CONFIG = "adapter.json"


@dataclass(frozen=True)
class AdapterKind:
    """One method's adapters: the `format` their adapter.json names, the projections carrying
    deltas, what errors call them, and the command that trains one."""

    format: str
    projections: tuple[str, ...]
    name: str
    train_command: str


@dataclass
class AdapterConfig:
    layers: list[int]
    rank: int = 8
    alpha: float = 16.0
    heads: list[list[int]] = field(default_factory=list)  # QRRanker: the head list it was trained with
    encoding: str = "block"  # QRRanker: the candidate encoding it was trained under

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoRAAdapter:
    """Low-rank deltas on the outputs of some layers' projections (delta(x) = s B A x, B starting at
    zero). The method applies them where it computes the adapted queries, keys or values
    (`delta`); the backbone's own passes never see them."""

    def __init__(self, kind: AdapterKind, config: AdapterConfig, hidden: int, q_out: int, k_out: int, device=None,
                 seed: int = 0, tensors: dict | None = None):
        """`k_out`: the output width of k_proj and v_proj (kv_heads * head_dim)."""
        import torch

        self.kind = kind
        self.config = config
        self.shapes = {p: q_out if p == "q" else k_out for p in kind.projections}
        self.params: dict = {}
        generator = torch.Generator().manual_seed(seed)
        for layer in config.layers:
            for proj, out in self.shapes.items():
                a_name, b_name = self.name(layer, proj, "A"), self.name(layer, proj, "B")
                if tensors is not None:
                    a, b = tensors[a_name].float(), tensors[b_name].float()
                    if a.shape != (config.rank, hidden) or b.shape != (out, config.rank):
                        raise ValueError(f"{a_name} and {b_name} have shapes {tuple(a.shape)} and {tuple(b.shape)}, "
                                         f"not {(config.rank, hidden)} and {(out, config.rank)}")
                else:
                    a = torch.randn(config.rank, hidden, generator=generator) / hidden ** 0.5
                    b = torch.zeros(out, config.rank)
                self.params[a_name] = a.to(device).requires_grad_(True)
                self.params[b_name] = b.to(device).requires_grad_(True)

    @staticmethod
    def name(layer: int, proj: str, which: str) -> str:
        return f"layers.{layer}.{proj}_proj.lora_{which}"

    @classmethod
    def for_model(cls, model, kind: AdapterKind, config: AdapterConfig, seed: int = 0,
                  tensors: dict | None = None) -> LoRAAdapter:
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(kind, config, cfg.hidden_size, cfg.num_attention_heads * head_dim,
                   cfg.num_key_value_heads * head_dim, model_device(model), seed, tensors)

    def has(self, layer: int) -> bool:
        return layer in self.config.layers

    def delta(self, layer: int, proj: str, x):
        """s B A x for rows x (..., hidden), float32 (..., out)."""
        a = self.params[self.name(layer, proj, "A")]
        b = self.params[self.name(layer, proj, "B")]
        return (x.float() @ a.t()) @ b.t() * self.config.scale

    def parameters(self) -> list:
        return list(self.params.values())

    def digest(self) -> str:
        import hashlib

        h = hashlib.blake2b(digest_size=8)
        for name in sorted(self.params):
            h.update(self.params[name].detach().float().cpu().numpy().tobytes())
        return h.hexdigest()

    def save(self, folder: str | Path, extra: dict | None = None) -> None:
        """OUT/adapter.safetensors and OUT/adapter.json (the config and `extra`)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().float().cpu().contiguous() for k, v in self.params.items()},
                  str(folder / ADAPTER_FILE))
        meta = {"format": self.kind.format, **asdict(self.config), "shapes": self.shapes, **(extra or {})}
        (folder / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=1) + "\n")


def load_adapter(folder: str | Path, model, kind: AdapterKind) -> LoRAAdapter:
    """The adapter of `kind` in `folder` (adapter.safetensors + adapter.json) on the model's
    device, frozen; a file of another kind or backbone shape is refused."""
    folder = Path(folder)
    config_file, tensor_file = folder / ADAPTER_CONFIG, folder / ADAPTER_FILE
    meta = read_json(config_file, f"the {kind.name}'s config", kind.train_command)
    if meta.get("format") != kind.format:
        raise ModelError(f"{config_file} is not a {kind.format} adapter (it says {meta.get('format')!r})",
                         f"give a folder written by: {kind.train_command} --out DIR")
    with reading(config_file, f"the {kind.name}'s config", kind.train_command):
        config = AdapterConfig(layers=[int(x) for x in meta["layers"]], rank=int(meta["rank"]),
                               alpha=float(meta["alpha"]), heads=[list(h) for h in meta.get("heads", [])],
                               encoding=meta.get("encoding", "block"))
        shapes = {k: int(v) for k, v in meta.get("shapes", {}).items()}
    check_heads(model, [(layer, 0) for layer in config.layers])
    tensors = read_tensors(tensor_file, f"the {kind.name}", kind.train_command)
    with reading(tensor_file, f"the {kind.name}", kind.train_command):
        adapter = LoRAAdapter.for_model(model, kind, config, tensors=tensors)
    if adapter.shapes != (shapes or adapter.shapes):
        raise ModelError(f"the adapter in {folder} was trained for another backbone shape",
                         f"train one for this backbone: {kind.train_command} --out DIR")
    for p in adapter.parameters():
        p.requires_grad_(False)
    return adapter
