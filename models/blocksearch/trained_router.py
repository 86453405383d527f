"""BlockSearch's trained router (issue 22): a LoRA on q_proj and k_proj of the layers up to the
routing layer L, trained with QRRanker's listwise loss on the routing score itself (the calibrated
attention mass of the QR heads at L, models/blocksearch/routing.py), as the seed trains the layers below L
with an attention loss.

Unlike QRRanker's and the decoder's adapters, this one changes the chunks' own encoding: the deltas
sit inside the backbone's q_proj / k_proj (forward hooks, only while BlockSearch encodes or queries
with it: `applied`), so the prefix's and every chunk's keys at L change. The key files are then
keyed by the adapter's digest (`BlockSearch.digest`): trained and untrained keys never mix. The
answering path never sees the adapter.

Training (`routing_scores`) runs the same passes as routing in prefix mode, with gradients: the
prefix, a few candidate chunks (gold + hard negatives; each a block after the prefix, positions
restarting there) and the question's and the null query's blocks, all through layer L; then the
mass of each QR head's softmax attention (over the prefix, the candidates and the query's own
tokens) onto each candidate's text tokens, averaged over the query span's rows, minus the null
query's, summed over the heads."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path

from evsel.models.shared.lora import AdapterConfig, AdapterKind, LoRAAdapter, load_adapter

FORMAT = "evsel-blocksearch-router/1"
ADAPTER = AdapterKind(format=FORMAT, projections=("q", "k"), name="BlockSearch router",
                      train_command="evsel train blocksearch --router")


def shipped_router_dir(fingerprint: str) -> Path:
    """Where a router trained for this backbone ships (beside the other adapters)."""
    return Path(__file__).resolve().parent.parent / "adapters" / fingerprint[:16] / "blocksearch-router"


def router_layers(layer: int, lora_layers: int | None) -> list[int]:
    """The adapted layers: the `lora_layers` top ones of 0..L (None: all of them)."""
    first = 0 if lora_layers is None else max(0, layer + 1 - int(lora_layers))
    return list(range(first, layer + 1))


def new_router_adapter(model, layers: list[int], rank: int = 8, alpha: float = 16.0, seed: int = 0) -> LoRAAdapter:
    """A fresh router adapter (B at zero: it routes as the untrained model)."""
    return LoRAAdapter.for_model(model, ADAPTER, AdapterConfig(layers=list(layers), rank=rank, alpha=alpha), seed)


def load_router_adapter(folder: str | Path, model) -> LoRAAdapter:
    return load_adapter(folder, model, ADAPTER)


@contextmanager
def applied(model, adapter: LoRAAdapter | None):
    """The adapter's deltas added to q_proj / k_proj outputs of its layers for the passes inside
    (nothing without an adapter)."""
    if adapter is None:
        yield
        return
    hooks = []
    for layer in adapter.config.layers:
        attn = model.model.layers[layer].self_attn
        for proj in adapter.kind.projections:
            module = getattr(attn, f"{proj}_proj")

            def add(_module, args, output, layer=layer, proj=proj):
                return output + adapter.delta(layer, proj, args[0]).to(output.dtype)

            hooks.append(module.register_forward_hook(add))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def adapted(model, adapter):
    return applied(model, adapter) if adapter is not None else nullcontext()


def _prefix_kv(model, ids: list[int], depth: int) -> list[tuple]:
    """The prefix's KV through `depth` layers, with gradients."""
    import torch
    from transformers import DynamicCache

    from evsel.models.runtime.backbone import run_layers
    from evsel.models.shared.blocksparse import model_device

    cache = DynamicCache()
    run_layers(model, [depth], input_ids=torch.tensor([ids], device=model_device(model)), cache=cache)
    return [(cache.layers[i].keys, cache.layers[i].values) for i in range(depth)]


def _block_keys(model, prefix_kv: list[tuple], blocks: list[list[int]], layer: int, pad_id: int) -> list:
    """Each block's post-RoPE keys (kv, L_i, d) at `layer`, encoded after the prefix (one padded
    batch, positions P..P+L_i-1), with gradients."""
    import torch

    from evsel.models.runtime.backbone import run_layers
    from evsel.models.shared.blocksparse import dynamic_cache

    depth = len(prefix_kv)
    p = int(prefix_kv[0][0].shape[-2])
    width = max(len(b) for b in blocks)
    x = torch.full((len(blocks), width), pad_id, dtype=torch.long)
    for row, b in enumerate(blocks):
        x[row, : len(b)] = torch.tensor(b)
    device = prefix_kv[0][0].device
    positions = (torch.arange(width) + p).expand(len(blocks), width).to(device)
    cache = dynamic_cache([(k.expand(len(blocks), -1, -1, -1), v.expand(len(blocks), -1, -1, -1))
                           for k, v in prefix_kv])
    run_layers(model, [depth], input_ids=x.to(device), cache=cache, position_ids=positions)
    keys = cache.layers[layer].keys
    return [keys[row, :, p:p + len(b)] for row, b in enumerate(blocks)]


def routing_scores(router, adapter: LoRAAdapter, question: str, texts: list[str]):
    """(K,) float32 routing scores of `texts` for `question` with the adapter, differentiable in
    it: the router's default scoring (prefix mode, query span, calibrated mass of its head set at
    L), the softmax over the prefix, these chunks and the query's own tokens."""
    import torch

    from evsel.models.shared.blocksparse import Context, suffix_states

    model, layer = router.model, router.layer
    with applied(model, adapter):
        prefix_kv = _prefix_kv(model, router.prefix_ids, router.depth)
        keys = _block_keys(model, prefix_kv, router.blocks(texts), layer, router.pad_id)
        context = Context(prefix_kv, [], router.query_position)
        asked = [question, router.config.prompt.null_query] if router.config.calibrate else [question]
        rows = [router.query_rows(q) for q in asked]
        states = suffix_states(model, context, [(router.suffix(q), a) for q, (a, _) in zip(asked, rows)], [layer])
    start = len(router.separator)
    lengths = [int(k.shape[1]) for k in keys]
    packed = torch.cat(keys, dim=1).float()  # (kv, T, d)
    counted = torch.cat([torch.arange(n) >= start for n in lengths])
    owner = torch.repeat_interleave(torch.arange(len(keys)), torch.tensor(lengths))
    heads = [h for h in range(router.n_heads) if router.head_mask[h]]
    g = router.n_heads // router.kv_heads
    prefix_keys = prefix_kv[layer][0][0].float()  # (kv, P, d)
    per_query = []
    for state, (a, b) in zip(states, rows):
        q = state.queries[layer][:, : b - a].float()  # (H, S, d)
        own = state.keys[layer].float()  # (kv, n, d)
        s = q.shape[1]
        seen = torch.arange(own.shape[1])[None] <= (a + torch.arange(s))[:, None]  # (S, n): causal
        total = torch.zeros(len(keys))
        for h in heads:
            kv = h // g
            logits = torch.cat([q[h] @ prefix_keys[kv].T, q[h] @ packed[kv].T,
                                (q[h] @ own[kv].T).masked_fill(~seen, float("-inf"))], dim=1) * router.scaling
            attn = torch.softmax(logits, dim=1)[:, prefix_keys.shape[1]: prefix_keys.shape[1] + packed.shape[1]]
            attn = attn * counted[None]
            mass = torch.zeros(s, len(keys)).index_add(1, owner, attn)  # (S, K)
            total = total + mass.mean(dim=0)
        per_query.append(total)
    return per_query[0] - per_query[1] if len(per_query) == 2 else per_query[0]
