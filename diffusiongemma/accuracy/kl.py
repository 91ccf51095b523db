"""`diffusiongemma kl`: how far a second checkpoint (quantized, ported) is from its base, as a distribution report
(docs/reference-accuracy.md, "KL divergence of a checkpoint").

The base model generates (a trace with the exact self-conditioning input of every step); both models then replay
every recorded step teacher-forced on the same inputs (committed prefix, input canvas, self-conditioning input,
temperature), and their full tempered distributions are compared at every denoising position of an active row:
KL(base || model), whether the top-1 tokens agree, and the change in probability of the base's top-1 token.

Near ties: where the base's two most likely tokens are closer than `NEAR_TIE` in probability, a different top-1 is
not a bug; those positions are counted apart (`near_ties`, `near_tie_flips`) and left out of `top1_agreement`.

Legend: B batch, L canvas length, V vocab, H hidden.
"""

import math

import torch

from .replay import PrefixEncoder, step_logprobs
from .stats import t_quantile

NEAR_TIE = 0.01  # base top-1 minus top-2 probability below this: a near tie
QUANTILES = ("50", "90", "95", "99", "max")


@torch.no_grad()
def positions_of(base, other, trace) -> dict[str, torch.Tensor]:
    """Per compared position (active rows of every record): kl, same_top1, dp, near_tie, and the sequence id (row)
    each belongs to. `trace` must hold `sc_embedding` (recorded with `trace_sc_embedding=True`)."""
    if trace.is_mixed:  # each row as the one-row trace it is (accuracy/rows.py), named by its row
        from .rows import recorded_rows

        parts = [(b, positions_of(base, other, trace.row(b))) for b in recorded_rows(trace)]
        return {k: torch.cat([p[k] if k != "row" else torch.full_like(p[k], b) for b, p in parts])
                for k in parts[0][1]}
    t = trace.tensors
    device = next(base.parameters()).device
    prefixes = [PrefixEncoder(m, trace, device) for m in (base, other)]
    out = {k: [] for k in ("kl", "same_top1", "dp", "near_tie", "row")}
    for c in range(trace.num_canvases):
        caches = [p.ready_for(c) for p in prefixes]
        for r in trace.steps(c).tolist():
            active = t["active"][r].to(device)
            if not bool(active.any()):
                continue
            canvas = t["input_canvas"][r].to(device).long()
            present = t["sc_present"][r].to(device)
            soft = None
            if bool(present.any()):
                soft = t["sc_embedding"][r].to(device) * present[:, None, None]
            T = float(t["temperature"][r])
            lp = [step_logprobs(m, canvas, cache, None if soft is None else soft.to(m.dtype), p.keep, T)[active].double()
                  for m, cache, p in zip((base, other), caches, prefixes)]  # [B_active, L, V] each
            p_base = lp[0].exp()
            kl = (p_base * (lp[0] - lp[1])).sum(dim=-1).clamp(min=0)  # [B_active, L]
            top2 = p_base.topk(2, dim=-1)
            top_base = top2.indices[..., 0]
            out["kl"].append(kl.flatten())
            out["same_top1"].append((lp[1].argmax(dim=-1) == top_base).flatten())
            out["dp"].append((lp[1].exp().gather(-1, top_base[..., None]) - top2.values[..., :1])[..., 0].flatten())
            out["near_tie"].append(((top2.values[..., 0] - top2.values[..., 1]) < NEAR_TIE).flatten())
            rows = torch.nonzero(active).view(-1)
            out["row"].append(rows[:, None].expand(-1, canvas.shape[1]).flatten())
    return {k: torch.cat(v).cpu() if v else torch.zeros(0) for k, v in out.items()}


def summarize_kl(parts: list[dict[str, torch.Tensor]]) -> dict:
    """The report over every position of every generation (`parts`: one `positions_of` result per generation).

    kl_ci95: a t interval from the per-sequence mean KLs (positions of one sequence are not independent); with a
    single sequence, a normal interval over its positions (optimistic)."""
    kl = torch.cat([p["kl"] for p in parts]).double()
    n = kl.numel()
    if n == 0:
        raise ValueError("no denoising position was compared (no active row in any step)")
    same = torch.cat([p["same_top1"] for p in parts])
    dp = torch.cat([p["dp"] for p in parts]).double()
    tie = torch.cat([p["near_tie"] for p in parts])
    seq_means = [float(p["kl"][p["row"] == b].double().mean()) for p in parts for b in p["row"].unique().tolist()]
    mean = float(kl.mean())
    if len(seq_means) >= 2:
        s = torch.tensor(seq_means, dtype=torch.float64)
        half = t_quantile(0.975, len(seq_means) - 1) * float(s.std()) / math.sqrt(len(seq_means))
    else:
        half = 1.96 * float(kl.std()) / math.sqrt(n) if n > 1 else 0.0
    q = torch.quantile(kl, torch.tensor([0.5, 0.9, 0.95, 0.99], dtype=torch.float64)).tolist()
    clear = ~tie
    return {
        "kl_mean": mean,
        "kl_ci95": [max(0.0, mean - half), mean + half],
        "kl_quantiles": dict(zip(QUANTILES, q + [float(kl.max())])),
        "top1_agreement": float(same[clear].double().mean()) if bool(clear.any()) else None,
        "dp_rms": float(dp.pow(2).mean().sqrt()),
        "positions": n,
        "sequences": len(seq_means),
        "near_ties": int(tie.sum()),
        "near_tie_flips": int((tie & ~same).sum()),
        "near_tie_epsilon": NEAR_TIE,
    }


def format_kl(report: dict) -> str:
    q = report["kl_quantiles"]
    agree = report["top1_agreement"]
    return "\n".join([
        f"positions        {report['positions']} ({report['sequences']} sequence(s))",
        f"KL mean          {report['kl_mean']:.6g}  95% CI [{report['kl_ci95'][0]:.6g}, {report['kl_ci95'][1]:.6g}]",
        "KL quantiles     " + "  ".join(f"{k}: {v:.4g}" for k, v in q.items()),
        f"top-1 agreement  {'-' if agree is None else f'{agree:.4%}'} (near ties left out)",
        f"dp RMS           {report['dp_rms']:.6g}",
        f"near ties        {report['near_ties']} (top-2 gap < {report['near_tie_epsilon']}), "
        f"{report['near_tie_flips']} flipped",
    ])
