"""The self-conditioning input of each replayed step, rebuilt from the trace's top-k record and our own previous step
(docs/trace-format.md, "Self-conditioning as top-k").

The decoder's self-conditioning input is `softmax(sc_logits) @ Emb * sqrt(H)` (spec C.9), where `sc_logits` is the
previous step's tempered distribution. A trace keeps only its top k (`sc_ids`, `sc_logprobs`). The rest of the
distribution is taken from **our** distribution at that previous step (which the replay computed from the trace's
own inputs): our probabilities outside the recorded ids, rescaled so the whole sums to 1. For an engine that computes
what we compute this is exact at any k, on flat and on peaked distributions alike; for one that does not, the record
still fixes the k most likely tokens, and the step it feeds is judged on its own anyway.

Where the record's top-k agrees with our previous step within rounding (`MATCH_TOLERANCE`, every recorded log-prob),
the two distributions are the same one, and the position gets our own input bit for bit: the tensor our step built
the way `generate` builds it, so a self-replay reproduces generation exactly.

Which record feeds which step follows spec D.4.4h as the trace states it: a row takes a step's distribution while it
has not stopped before that step (`stopped` of the record before), and keeps its last one after that.

Legend: B batch, L canvas length, V vocab, H hidden, k top-k width.
"""

from dataclasses import dataclass

import torch

MATCH_TOLERANCE = 1e-5  # |recorded - our log-prob| on every recorded id: "the same distribution", up to fp32 rounding


@dataclass
class SourceShares:
    """Where one step's self-conditioning input came from, as shares of its probability mass (means over the active
    positions that have one; NaN when none does).

    record: the recorded top-k probabilities (1 with `sc_embedding` or k = V). ours: our previous step's
    distribution outside the recorded ids. spread: spread evenly over the other tokens (no previous step of ours to
    take it from, e.g. a caller-seeded first step). matched: share of positions whose record equals our previous
    step within `MATCH_TOLERANCE`, fed our own input bit for bit.
    """

    record: float
    ours: float
    spread: float
    matched: float

    @classmethod
    def none(cls) -> "SourceShares":
        nan = float("nan")
        return cls(nan, nan, nan, nan)


def soft_from_top_k(stack, ids: torch.Tensor, logprobs: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """The self-conditioning input [B, L, H] from a top-k record alone: ids [B, L, k], log-probs [B, L, k],
    present [B], with the remaining mass spread evenly over the other V - k tokens (exact when k = V). Rows not
    present get zeros, which gives no self-conditioning, like the first step. The fallback where no previous step
    of ours exists."""
    weight = stack.embed_tokens.weight  # [V, H]
    V, k = weight.shape[0], ids.shape[-1]
    p = logprobs.double().exp()  # [B, L, k]
    rows = weight[ids.long()].double()  # [B, L, k, H]
    top = (p[..., None] * rows).sum(dim=-2)  # [B, L, H]
    if k < V:
        tail = (1 - p.sum(dim=-1, keepdim=True)).clamp(min=0) / (V - k)  # [B, L, 1]
        top = top + tail * (weight.double().sum(dim=0) - rows.sum(dim=-2))
    return (top.to(weight.dtype) * stack.embed_tokens.scale()) * present.to(weight.dtype)[:, None, None]


def mixed_distribution(ours_logits: torch.Tensor, ids: torch.Tensor, rec_logprobs: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The recorded top-k probabilities, and our distribution elsewhere rescaled to the mass the record leaves.

    Args:
        ours_logits: [B, L, V] our tempered logits of the step the record's distribution came from.
        ids / rec_logprobs: [B, L, k] the record's top-k.
    Returns:
        (probs [B, L, V] fp32 summing to 1, ours_tail [B, L] bool: our tail carried the rest (False: our tail was
        empty while the record's was not, so the rest is spread evenly).
    Example: V = 4, ours p = (0.4, 0.3, 0.2, 0.1), record k = 1: token 0 at 0.5 -> (0.5, 0.25, 0.1667, 0.0833).
    """
    q = torch.softmax(ours_logits.float(), dim=-1)  # [B, L, V]
    ids = ids.long()
    p_rec = rec_logprobs.double().exp()  # [B, L, k]
    rest_rec = (1 - p_rec.sum(dim=-1)).clamp(min=0)  # [B, L]
    rest_ours = (1 - q.gather(-1, ids).double().sum(dim=-1)).clamp(min=0)  # [B, L]
    has_tail = rest_ours > 1e-30
    factor = torch.where(has_tail, rest_rec / rest_ours.clamp(min=1e-30), torch.zeros_like(rest_ours))
    V, k = q.shape[-1], ids.shape[-1]
    even = torch.where(has_tail | (rest_rec == 0), torch.zeros_like(rest_rec), rest_rec / max(V - k, 1))
    # fp32 [B, L, V] (no fp64 copy of the whole vocabulary: 1 GiB per row at L = 256, V = 262144)
    probs = (q * factor.float()[..., None] + even.float()[..., None]).scatter_(-1, ids, p_rec.float())
    return probs, has_tail | (rest_rec == 0)


class SelfConditioningRebuild:
    """Per canvas, remembers our previous steps (tempered logits and the input we built from them) and turns each
    record's top-k into the decoder's self-conditioning input."""

    def __init__(self, stack, batch: int):
        self.stack, self.batch = stack, batch
        self.begin_canvas()

    def begin_canvas(self) -> None:
        self.logits = None  # [B, L, V] our tempered logits of each row's last feeding step
        self.soft = None  # [B, L, H] the input our step built from them (as generate does)
        self.have = torch.zeros(self.batch, dtype=torch.bool)
        self.first = True

    def input(self, t: dict, r: int) -> tuple[torch.Tensor | None, SourceShares]:
        """The self-conditioning input [B, L, H] of record r (None when no row has one) and where it came from."""
        present = t["sc_present"][r]  # [B]
        if not bool(present.any()):
            return None, SourceShares.none()
        weight = self.stack.embed_tokens.weight
        counted = (present & t["active"][r]).cpu()  # [B] rows whose shares are reported
        if "sc_embedding" in t:
            soft = t["sc_embedding"][r]  # [B, L, H]
            if soft.shape[-1] != weight.shape[1]:
                from .format import TraceFormatError

                raise TraceFormatError(f"tensor `sc_embedding` has H = {soft.shape[-1]}, the model's hidden size is "
                                       f"{weight.shape[1]}")
            return soft.to(weight.dtype) * present.to(weight.dtype)[:, None, None], SourceShares(1.0, 0.0, 0.0, 0.0)
        ids, rec = t["sc_ids"][r], t["sc_logprobs"][r]  # [B, L, k]
        fallback = soft_from_top_k(self.stack, ids, rec, present)  # [B, L, H]
        record_mass = rec.double().exp().sum(dim=-1).clamp(max=1).cpu()  # [B, L]
        B, L = record_mass.shape
        ours_share = torch.zeros(B, L, dtype=torch.float64)
        matched = torch.zeros(B, L, dtype=torch.bool)
        soft = fallback
        have = (self.have & present.cpu()).to(ids.device)  # [B] rows with a previous step of ours
        if self.logits is not None and bool(have.any()):
            probs, ours_tail = mixed_distribution(self.logits, ids, rec)
            mixed = self.stack.embed_tokens.soft(probs)  # [B, L, H]
            ours_lp = torch.log_softmax(self.logits.float(), dim=-1).gather(-1, ids.long())  # [B, L, k]
            same = (ours_lp - rec.float()).abs().amax(dim=-1) <= MATCH_TOLERANCE  # [B, L]
            same = same & have[:, None]
            soft = torch.where(have[:, None, None], mixed.to(fallback.dtype), fallback)
            soft = torch.where(same[..., None], self.soft.to(soft.dtype), soft)
            matched = same.cpu()
            from_ours = (have[:, None] & ours_tail).cpu()
            ours_share = torch.where(from_ours, 1 - record_mass, ours_share)
        soft = soft * present.to(soft.dtype)[:, None, None]
        spread = 1 - record_mass - ours_share
        sel = counted[:, None].expand(B, L)
        if not bool(sel.any()):
            return soft, SourceShares.none()
        return soft, SourceShares(float(record_mass[sel].mean()), float(ours_share[sel].mean()),
                                  float(spread[sel].clamp(min=0).mean()), float(matched[sel].double().mean()))

    def update(self, t: dict, r: int, out) -> None:
        """After our step at record r (`engine.StepResult` with its tempered logits): rows that had not stopped
        before this step (the record before says) take this step as their next self-conditioning source."""
        feeds = torch.ones(self.batch, dtype=torch.bool, device=out.logits.device)
        if not self.first:
            feeds = ~t["stopped"][r - 1].to(out.logits.device)
        self.first = False
        if self.logits is None:
            self.logits, self.soft = out.logits.clone(), out.soft.clone()
        else:
            self.logits = torch.where(feeds[:, None, None], out.logits, self.logits)
            self.soft = torch.where(feeds[:, None, None], out.soft.to(self.soft.dtype), self.soft)
        self.have = self.have | feeds.cpu()
