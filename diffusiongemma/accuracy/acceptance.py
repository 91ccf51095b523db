"""The `acceptance` check of `compare` (docs/reference-accuracy.md, "Checks"): the recorded accepted mask of every
step against the recorded sampler's own rule, applied to what the trace records (no model run, no random draw).

    entropy bound         accepted = the entropy-bound prefix of the recorded entropies
    confidence threshold  newly committed = the uncommitted positions whose draw has probability >= threshold (with
                          `factor`: Fast-dLLM's bar 1 - factor / (n + 1) for the n-th), at least the most probable one
    block refinement      newly committed = the quota's most probable draws, plus every draw above `threshold`
    discrete DDIM         the last predictor step takes x0 everywhere; a corrector pass resamples exactly k positions
                          and keeps the rest; a predictor step's clean routes agree with the route probabilities of
                          the recorded (x_t, x0), and take x0 in the next input

The commit-style rules and DDIM's route statistics need the optional `draw_ids` / `draw_logprobs` (the drawn token of
every position and its tempered log-probability, docs/trace-format.md); without them only what the rule fixes
whatever the draw is checked, and the result's `reason` says the check was partial.

Legend: R records, B batch, L canvas length, V vocab, N max_denoising_steps.
"""

import math

import torch

from .checks import CheckResult, Tolerances, _Collector, _where, skipped

NO_DRAWS = "partial: the trace lacks `draw_ids` / `draw_logprobs`, so only what the rule fixes whatever the draw is"


def has_draws(t: dict) -> bool:
    return "draw_ids" in t and "draw_logprobs" in t


def check_acceptance(t: dict, sampler_config, tol: Tolerances, max_steps: int | None = None,
                     vocab_size: int | None = None) -> CheckResult:
    """The recorded `accepted` of every active row against the rule of `sampler_config` (see the module doc)."""
    from ..generation.block_refinement import BlockRefinementSamplerConfig
    from ..generation.confidence_threshold import ConfidenceThresholdSamplerConfig
    from ..generation.discrete_ddim import DiscreteDDIMSamplerConfig
    from ..sampler_configs import EntropyBoundSamplerConfig

    if isinstance(sampler_config, (BlockRefinementSamplerConfig, ConfidenceThresholdSamplerConfig)):
        return check_commit_rule(t, sampler_config, tol, max_steps)
    if isinstance(sampler_config, DiscreteDDIMSamplerConfig):
        if max_steps is None:
            return skipped("acceptance", "manifest `generation_config` lacks `max_denoising_steps` (the DDIM schedule)")
        return check_ddim_routes(t, sampler_config, tol, int(max_steps), vocab_size)
    if not isinstance(sampler_config, EntropyBoundSamplerConfig):
        return skipped("acceptance", f"no acceptance rule is known for {type(sampler_config).__name__}")
    return check_entropy_bound(t, float(sampler_config.entropy_bound), tol)


def check_entropy_bound(t: dict, bound: float, tol: Tolerances) -> CheckResult:
    """A position accepted with the bound lowered by tol.near_tie (relative), or refused with it raised by as much,
    must be so."""
    from ..generation.entropy_bound import entropy_bound_accept

    slack = tol.near_tie * bound
    out = _Collector("acceptance")
    for r in range(t["active"].shape[0]):
        c, s = _where(t, r)
        entropy = t["entropy"][r].double()
        must = entropy_bound_accept(entropy, bound - slack)
        may = entropy_bound_accept(entropy, bound + slack)
        for b in torch.nonzero(t["active"][r]).view(-1).tolist():
            out.count()
            acc = t["accepted"][r, b]
            bad = (must[b] & ~acc) | (acc & ~may[b])
            if bool(bad.any()):
                p = int(torch.nonzero(bad)[0])
                out.fail(c, s, b, p, f"recorded accepted={bool(acc[p])} at entropy {float(entropy[b, p]):.4g}; the "
                                     f"entropy bound {bound} says {bool(may[b, p])} "
                                     f"({int(acc.sum())} accepted, the rule {int(must[b].sum())})")
    return out.result


def commit_bounds(free: torch.Tensor, conf: torch.Tensor, sampler_config, step: int, owed: int,
                  slack: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(must, may) [L] bool: the positions the rule commits this step whatever the near ties, and those it may.

    free [L] bool (not committed yet), conf [L] float64: each draw's probability; owed: block refinement's quota
    still owed this step. A probability within `slack` (relative) of a bar or of the value it is ranked against may
    go either way.
    """
    from ..generation.block_refinement import BlockRefinementSamplerConfig

    ranked = conf.masked_fill(~free, -math.inf).sort(descending=True).values  # [L] free first
    n_free = int(free.sum())
    if isinstance(sampler_config, BlockRefinementSamplerConfig):
        thr = sampler_config.threshold
        must = free & (conf > thr * (1 + slack))
        may = free & (conf > thr * (1 - slack))
        if owed > 0:
            last = float(ranked[min(owed, n_free) - 1])  # the least probable draw the quota takes
            after = float(ranked[owed]) if owed < n_free else -math.inf  # the most probable it leaves
            must |= free & (conf > after * (1 + slack)) if after > -math.inf else free
            may |= free & (conf >= last * (1 - slack))
        return must, may
    thr, factor = sampler_config.threshold, sampler_config.factor
    if factor is None:
        must, may = free & (conf >= thr * (1 + slack)), free & (conf >= thr * (1 - slack))
    else:  # the n-th most probable free draw (1-based) needs 1 - factor / (n + 1)
        from ..generation.commit import descending_ranks

        n = descending_ranks(conf.masked_fill(~free, -math.inf)[None])[0].double() + 1
        must = free & (conf >= 1 - factor * (1 - slack) / (n + 1))
        may = free & (conf >= 1 - factor * (1 + slack) / (n + 1))
    if n_free:  # at least the most probable free draw (either of a near tie)
        top = float(ranked[0])
        near_top = free & (conf >= top * (1 - slack))
        may |= near_top
        if int(near_top.sum()) == 1:
            must |= near_top
    return must, may


def check_commit_rule(t: dict, sampler_config, tol: Tolerances, max_steps: int | None) -> CheckResult:
    """Commit-style samplers (`accepted` is the committed mask after the step): a committed position stays committed;
    with the draws recorded, the newly committed positions are the rule's on the draws' probabilities and take the
    draw in the next input; without them, block refinement's quota min(L, ceil((s + 1) L / N)) is checked."""
    from ..generation.block_refinement import BlockRefinementSamplerConfig

    block = isinstance(sampler_config, BlockRefinementSamplerConfig)
    if block and max_steps is None:
        return skipped("acceptance", "manifest `generation_config` lacks `max_denoising_steps` (block refinement's "
                                     "quota)")
    draws = has_draws(t)
    out = _Collector("acceptance")
    R, _, L = t["accepted"].shape
    ci = t["canvas_index"]
    for r in range(R):
        c, s = _where(t, r)
        for b in torch.nonzero(t["active"][r]).view(-1).tolist():
            out.count()
            acc = t["accepted"][r, b]
            prev = t["accepted"][r - 1, b] if s > 0 else torch.zeros_like(acc)
            lost = prev & ~acc
            if bool(lost.any()):
                out.fail(c, s, b, int(torch.nonzero(lost)[0]), "a committed position is no longer committed")
                continue
            new = acc & ~prev
            owed = 0
            if block:
                target = min(L, -(-(s + 1) * L // int(max_steps)))
                owed = max(0, target - int(prev.sum()))
                if int(acc.sum()) < target:
                    out.fail(c, s, b, None, f"{int(acc.sum())} positions committed after step {s}, block "
                                            f"refinement's quota is {target} (L = {L}, N = {max_steps})")
                    continue
            if not draws:
                continue
            conf = t["draw_logprobs"][r, b].double().exp()  # [L]
            must, may = commit_bounds(~prev, conf, sampler_config, s, owed, tol.near_tie)
            bad = (must & ~new) | (new & ~may)
            if bool(bad.any()):
                p = int(torch.nonzero(bad)[0])
                out.fail(c, s, b, p, f"recorded newly committed={bool(new[p])} for a draw of probability "
                                     f"{float(conf[p]):.4g}; {type(sampler_config).__name__}'s rule says "
                                     f"{bool(must[p])} ({int(new.sum())} newly committed, the rule {int(must.sum())} "
                                     f"to {int(may.sum())})")
                continue
            if r + 1 < R and int(ci[r + 1]) == c and bool(t["active"][r + 1, b]):
                moved = new & (t["input_canvas"][r + 1, b] != t["draw_ids"][r, b])
                if bool(moved.any()):
                    out.fail(c, s, b, int(torch.nonzero(moved)[0]), "a newly committed position does not hold its "
                                                                    "draw in the next input")
    if not draws:
        out.result.reason = NO_DRAWS + " checked (committed positions stay committed; block refinement's quota)"
    return out.result


def check_ddim_routes(t: dict, sampler_config, tol: Tolerances, max_steps: int, vocab_size: int | None
                      ) -> CheckResult:
    """Discrete DDIM by its pass schedule: the last predictor step accepts every position; a corrector pass leaves
    exactly min(k, L) positions not accepted and the others unchanged in the next input; with the draws (x0)
    recorded, a predictor step's accepted positions hold x0 in the next input and their count lies within
    tol.route_sigmas binomial standard deviations (plus 2) of the clean-route mass of the recorded (x_t, x0), over
    all predictor steps (for power), separately where x_t == x0 (clean almost surely) and where not."""
    from ..generation.discrete_ddim import pass_schedule, route_probabilities

    schedule = pass_schedule(max_steps, sampler_config.corrector_steps)
    predictors = schedule[-1][0] + 1
    draws = has_draws(t) and vocab_size is not None
    out = _Collector("acceptance")
    R, _, L = t["accepted"].shape
    ci = t["canvas_index"]
    strata = {True: RouteCount(), False: RouteCount()}  # x_t == x0 (clean almost surely) / x_t != x0
    for r in range(R):
        c, s = _where(t, r)
        if s >= len(schedule):
            out.fail(c, s, None, None, f"step {s} beyond the {len(schedule)} passes of the schedule")
            continue
        i, correcting = schedule[s]
        nxt = r + 1 < R and int(ci[r + 1]) == c
        for b in torch.nonzero(t["active"][r]).view(-1).tolist():
            out.count()
            acc = t["accepted"][r, b]
            follows = nxt and bool(t["active"][r + 1, b])
            if correcting:
                k = min(sampler_config.corrector_k, L)
                changed = acc & (t["input_canvas"][r + 1, b] != t["input_canvas"][r, b]) if follows else acc & False
                if int((~acc).sum()) != k:
                    out.fail(c, s, b, None, f"a corrector pass resampled {int((~acc).sum())} positions, corrector_k "
                                            f"is {k}")
                elif bool(changed.any()):
                    out.fail(c, s, b, int(torch.nonzero(changed)[0]), "a corrector pass changed a position it did "
                                                                      "not resample")
                continue
            if i == predictors - 1 and not bool(acc.all()):
                out.fail(c, s, b, int(torch.nonzero(~acc)[0]), "the last predictor step (alpha_s = 1) takes x0 "
                                                                "everywhere; a position was not accepted")
                continue
            if not draws:
                continue
            x0, xt = t["draw_ids"][r, b].long(), t["input_canvas"][r, b].long()
            wrong = acc & (t["input_canvas"][r + 1, b].long() != x0) if follows else acc & False
            if bool(wrong.any()):
                out.fail(c, s, b, int(torch.nonzero(wrong)[0]), "an accepted (clean-route) position does not hold "
                                                                 "x0 in the next input")
                continue
            clean = route_probabilities(xt[None], x0[None], i, predictors, vocab_size)[0, :, 0].double()  # [L]
            for same, count in strata.items():
                where = (xt == x0) == same
                count.add(c, s, b, int(acc[where].sum()), clean[where])
    for same, count in strata.items():
        failure = count.verdict(tol.route_sigmas)
        if failure is not None:
            c, s, b, detail = failure
            out.fail(c, s, b, None, f"{detail} on the positions where x_t {'==' if same else '!='} x0 (all "
                                    "predictor steps; the step named has the largest excess)")
    if not draws:
        out.result.reason = NO_DRAWS + (" checked (the last predictor step accepts all; a corrector pass resamples "
                                        "exactly corrector_k)")
    return out.result


class RouteCount:
    """Clean routes taken against their probabilities, summed over steps, with the step of the largest excess."""

    def __init__(self):
        self.hits, self.mu, self.var, self.worst, self.where = 0, 0.0, 0.0, -math.inf, None

    def add(self, c: int, s: int, b: int, hits: int, clean: torch.Tensor) -> None:
        mu, var = float(clean.sum()), float((clean * (1 - clean)).sum())
        self.hits, self.mu, self.var = self.hits + hits, self.mu + mu, self.var + var
        excess = abs(hits - mu) / math.sqrt(var + 1)
        if excess > self.worst:
            self.worst, self.where = excess, (c, s, b)

    def verdict(self, sigmas: float):
        """None, or (canvas, step, row, detail) when the count lies beyond `sigmas` standard deviations plus 2."""
        sd = math.sqrt(self.var)
        if abs(self.hits - self.mu) <= sigmas * sd + 2:
            return None
        detail = (f"{self.hits} clean routes, the route probabilities of the recorded x_t and x0 expect "
                  f"{self.mu:.1f} +- {sd:.1f}")
        return (*self.where, detail)
