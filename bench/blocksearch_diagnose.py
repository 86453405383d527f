"""What BlockSearch's routing score prefers: FairytaleQA val questions over their own story's
chunks, the routing layer's keys and query states computed once per story / question, and every
scoring rule compared on the same states.

    EVSEL_THREADS=1 python bench/blocksearch_diagnose.py --limit 100 [--out bench/results/blocksearch-diagnose.json]

Per question and rule: the gold chunk's rank (recall@1/5); per rule, averaged over questions,
Spearman's correlation of the chunk scores with chunk length (tokens) and between two questions
of the same story (1.0: the score ignores the question). For the shipped MaxSim: where inside the
block its max lands (relative position 0 = the first text token after the separator, right after
the RoPE restart) and how often on punctuation.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import data_dir, load_1m, write_result  # noqa: E402


def ranks(x):
    import numpy as np

    order = np.argsort(x, kind="stable")
    out = np.empty(len(x))
    out[order] = np.arange(len(x))
    return out


def spearman(a, b) -> float:
    import numpy as np

    ra, rb = ranks(np.asarray(a, float)), ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--out", default="bench/results/blocksearch-diagnose.json")
    parser.add_argument("--no-qrranker", action="store_true", help="skip QRRanker's own scorer (all 16 heads)")
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from evsel.ingest import chunker
    from evsel.evaluation.datasets import load_dataset
    from evsel.evaluation.gold import resolve
    from evsel.evaluation.report import run_info
    from evsel.models.blocksearch import routing as bs
    from evsel.models.blocksearch.scoring import head_logits
    from evsel.models.qrranker import rerank as qr
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.shared.blocksparse import Context, ReadStates, SuffixStates, head_attention, suffix_states
    from evsel.store.store import ChunkRecord

    backbone = Backbone(threads=int(os.environ.get("EVSEL_THREADS") or 1))
    _ = backbone.model
    router = bs.BlockSearch(backbone, bs.BlockSearchConfig())  # only its keys, prompt and states are read
    heads, _where = qr.resolve_heads(backbone, None, "block")
    qr_scorer = None if args.no_qrranker else qr.QRScorer(backbone, heads)
    data = load_dataset("fairytaleqa", data_dir(), "val")
    questions = data.questions[: args.limit]
    tok = backbone.tokenizer
    punct = {i for i in range(len(tok)) if all(not ch.isalnum() for ch in tok.decode([i]).strip() or "x")}

    rules: dict[str, list] = {}
    per_q: list[dict] = []
    length_corr: dict[str, list] = {}
    argmax_pos: list[int] = []
    argmax_punct: list[bool] = []
    story_scores: dict[str, dict[str, list]] = {}
    started = time.perf_counter()
    by_doc: dict[str, list] = {}
    for q in questions:
        by_doc.setdefault(q.docs[0], []).append(q)
    rng = random.Random(0)
    for key, qs in by_doc.items():
        doc = data.loaders[key]()
        pieces = chunker.chunk_document(doc, backbone)
        chunks = [ChunkRecord(id=i + 1, doc_id=1, **c.record()) for i, c in enumerate(pieces)]
        texts = [c.text for c in chunks]
        scope = router.scope(texts)
        lengths = np.diff(scope.packed.offsets) - len(router.separator)
        start = len(router.separator)
        layer = router.layer
        prefix_keys = router.prefix_kv[layer][0][0].float()  # (kv, P, d)
        ctx_keys = torch.cat([prefix_keys, scope.packed.keys.float()], dim=1)
        p = prefix_keys.shape[1]
        spans = [(p + int(a) + start, p + int(b)) for a, b in zip(scope.packed.offsets[:-1], scope.packed.offsets[1:])]
        context = Context(router.prefix_kv, [], router.query_position)
        null_suffix = router.suffix("N/A")
        null_len = len(router.prompt.ids(" N/A"))
        for q in qs:
            gold = sorted({i for g in q.gold for i in resolve(g, doc, chunks)[0]})
            if not gold:
                continue
            suffix = router.suffix(q.question)
            # where the question's tokens sit in the suffix: after "<sep>closing<sep>Query:"
            head_ids = router.prompt.ids(f"{router.config.prompt.closing}{router.config.prompt.separator}"
                                         f"{router.config.prompt.query_label}")
            q_start = len(router.separator) + len(head_ids)
            q_len = len(router.prompt.ids(f" {q.question.strip()}")[: router.config.prompt.max_query_tokens])
            with torch.inference_mode():
                real, null = suffix_states(router.model, context, [(suffix, 0), (null_suffix, 0)], [layer])
            qs_all = real.queries[layer].float()  # (H, S, d) every suffix token
            rows = {}
            shipped = bs.maxsim(qs_all[:, -1], scope.packed, router.scaling).double().numpy()  # (N, H)
            rows["maxsim (shipped: last token, all heads)"] = shipped.sum(1)
            # where the max lands, for the shipped rule
            logits = head_logits(qs_all[:, -1], scope.packed.keys, router.scaling).numpy()  # (H, T)
            for i, (a, b) in enumerate(zip(scope.packed.offsets[:-1], scope.packed.offsets[1:])):
                seg = logits[:, a + start:b]
                pos = seg.argmax(axis=1)
                argmax_pos.extend(pos.tolist())
                ids = scope.blocks[i][start:]
                argmax_punct.extend(ids[j] in punct for j in pos)
            masked = logits.copy()
            for a in scope.packed.offsets[:-1]:
                masked[:, a: a + start + 1] = -np.inf  # separator and the first text token
            seg_max = np.maximum.reduceat(np.where(np.isfinite(masked), masked, -1e9),
                                          scope.packed.offsets[:-1], axis=1)
            rows["maxsim, first text token excluded"] = seg_max.sum(0)
            z = (shipped - shipped.mean(0)) / (shipped.std(0) + 1e-9)
            rows["maxsim / (per-head z-score over chunks)"] = z.sum(1)
            null_ms = bs.maxsim(null.queries[layer].float()[:, -1], scope.packed, router.scaling).double().numpy()
            rows["maxsim - N/A maxsim (last token)"] = (shipped - null_ms).sum(1)
            qtok = qs_all[:, q_start:q_start + q_len]  # (H, S_q, d)
            tok_ms = np.stack([bs.maxsim(qtok[:, s], scope.packed, router.scaling).double().numpy()
                               for s in range(qtok.shape[1])])  # (S_q, N, H)
            rows["maxsim over question tokens (mean)"] = tok_ms.mean(0).sum(1)
            # attention of query tokens (softmax over prefix + scope + own), QRHead style
            for span_name, (s0, s1) in {"question tokens": (q_start, q_start + q_len),
                                        "whole query span": (len(router.separator), len(suffix))}.items():
                read = ReadStates({layer: ctx_keys}, None, None)
                def states(st, a, b):
                    return SuffixStates({layer: st.queries[layer][:, a:b]}, {layer: st.keys[layer][:, :b]}, None,
                                        None, a)

                null_b = len(null_suffix)
                null_a = len(router.separator) if span_name == "whole query span" else q_start
                null_b = len(null_suffix) if span_name == "whole query span" else q_start + null_len
                with torch.inference_mode():
                    [att] = head_attention(router.model, read, [states(real, s0, s1)], [layer])
                    [natt] = head_attention(router.model, read, [states(null, null_a, null_b)], [layer])
                att, natt = att[layer], natt[layer]  # (H, T_ctx)
                mass = np.array([att[:, a:b].sum().item() for a, b in spans])
                rows[f"mass, {span_name}, all heads"] = mass
                rows[f"mass / length, {span_name}"] = mass / lengths
                cal = {layer: att - natt}
                rows[f"calibrated (- N/A), {span_name}, all heads (trimmed)"] = qr.chunk_scores(
                    cal, spans, [(layer, h) for h in range(router.n_heads)])
                at_l = [(layer, h) for (l, h) in heads if l == layer]
                rows[f"calibrated, {span_name}, QR heads at L{layer} {[h for _, h in at_l]}"] = qr.chunk_scores(
                    cal, spans, at_l)
            rows["mass (shipped: last token)"] = bs.attention_mass(
                qs_all[:, -1], scope.packed, router.scaling, 1.0,
                torch.cat([prefix_keys, real.keys[layer].float()], 1)).double().numpy().sum(1)
            if qr_scorer is not None:
                rows["QRRanker (16 heads, L8-23, its own prompt)"] = qr_scorer.scores(q.question, texts)
            rows["random"] = np.array([rng.random() for _ in texts])
            record = {"qid": q.qid, "n": len(texts), "gold": gold}
            for name, s in rows.items():
                order = np.argsort(-np.asarray(s), kind="stable")
                rank = int(min(np.flatnonzero(np.isin(order, gold)))) + 1
                record[name] = rank
                rules.setdefault(name, []).append(rank)
                length_corr.setdefault(name, []).append(spearman(s, lengths))
                story_scores.setdefault(name, {}).setdefault(key, []).append(np.asarray(s))
            per_q.append(record)
        print(f"{key}: {len(qs)} questions, {len(texts)} chunks, {time.perf_counter() - started:.0f}s",
              file=sys.stderr, flush=True)

    summary = {}
    for name, rs in rules.items():
        rs = np.array(rs)
        cross = [spearman(v[i], v[i + 1]) for v in story_scores[name].values() for i in range(len(v) - 1)]
        summary[name] = {"R@1": round(float((rs <= 1).mean()), 3), "R@3": round(float((rs <= 3).mean()), 3),
                         "R@5": round(float((rs <= 5).mean()), 3), "MRR": round(float((1 / rs).mean()), 3),
                         "spearman_vs_length": round(float(np.nanmean(length_corr[name])), 3),
                         "spearman_between_questions": round(float(np.nanmean(cross)), 3)}
    pos = np.array(argmax_pos)
    shipped_argmax = {"share_at_first_text_token": round(float((pos == 0).mean()), 3),
                      "share_in_first_4": round(float((pos < 4).mean()), 3),
                      "share_on_punctuation": round(float(np.mean(argmax_punct)), 3),
                      "median_position": float(np.median(pos))}
    result = {"run": run_info(["python", "bench/blocksearch_diagnose.py", *(argv or sys.argv[1:])]),
              "questions": len(per_q), "layer": router.layer, "load_before": load_1m(),
              "seconds": round(time.perf_counter() - started, 1), "summary": summary,
              "shipped_maxsim_argmax": shipped_argmax, "per_question": per_q}
    write_result(Path(args.out), result)
    width = max(len(n) for n in summary)
    print(f"{'rule':{width}}  R@1   R@3   R@5   MRR   rho(len) rho(q,q')")
    for name, s in summary.items():
        print(f"{name:{width}}  {s['R@1']:.3f} {s['R@3']:.3f} {s['R@5']:.3f} {s['MRR']:.3f} "
              f"{s['spearman_vs_length']:+.3f}   {s['spearman_between_questions']:+.3f}")
    print("shipped MaxSim argmax:", shipped_argmax)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
