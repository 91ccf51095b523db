"""The algorithm checks of `compare` (docs/reference-accuracy.md, "Checks"): each recorded step judged on what the
trace itself states, without running the model. One pure function per check: the trace's tensors and recorded
settings in, a `CheckResult` out (pass, fail with the first failing canvas / step / row / position, or skipped with
the reason). The `model` check (our distribution against the recorded one) lives in replay.py / report.py.

    temperature        recorded T against the linear schedule of the recorded t_min, t_max, max_denoising_steps
    self_conditioning  the recorded input against the previous step's recorded distribution; none at a first step
    stop               the recorded stop decision against the stopper fed the recorded argmax and entropy history
    commit             the committed canvas against the last active step's argmax, EOS and pad rules applied
    acceptance         the recorded accepted mask against the sampler's own rule (acceptance.py)
    renoise            positions not accepted hold fresh uniform noise, not the step's sample

Legend: R records, B batch, L canvas length, k top-k width, V vocab.
"""

import math
from dataclasses import asdict, dataclass, field

import torch

from ..generation.entropy_bound import temperature_at
from ..generation.stopping import StableAndConfidentStopper, pad_after_eos

CHECKS = ("model", "temperature", "self_conditioning", "stop", "commit", "acceptance", "renoise")


@dataclass(frozen=True)
class Tolerances:
    """Default slack a correct engine in bf16 passes (each has a `compare` flag).

    temperature: |recorded - schedule|. sc_logprob: |recorded self-conditioning log-prob - previous step's| (nats).
    sc_embedding: largest |value| of the self-conditioning input where none is due (exactly zero by default).
    near_tie: relative slack of a threshold comparison (entropy bound, confidence threshold) within which either
    decision passes. renoise_sigmas: binomial z-score above which too many non-accepted positions hold the argmax.
    route_sigmas: binomial z-score of discrete DDIM's clean-route count against its route probabilities.
    """

    temperature: float = 1e-3
    sc_logprob: float = 2e-2
    sc_embedding: float = 0.0
    near_tie: float = 1e-3
    renoise_sigmas: float = 6.0
    route_sigmas: float = 6.0


@dataclass
class Failure:
    """Where a check first failed: position None for a whole-row (or whole-step) decision."""

    check: str
    canvas: int
    step: int
    row: int | None
    position: int | None
    detail: str


@dataclass
class CheckResult:
    """One check over the whole trace: status "pass", "fail" or "skipped" (reason says why)."""

    name: str
    status: str
    checked: int = 0  # decisions compared (steps, rows or positions, per check)
    failures: int = 0
    first: Failure | None = None
    reason: str = ""
    failing_steps: list = field(default_factory=list)  # [(canvas, step)] in record order

    def as_dict(self) -> dict:
        return asdict(self)


class _Collector:
    def __init__(self, name: str):
        self.result = CheckResult(name, "pass")

    def count(self, n: int = 1) -> None:
        self.result.checked += n

    def fail(self, canvas: int, step: int, row, position, detail: str) -> None:
        r = self.result
        r.failures += 1
        r.status = "fail"
        if r.first is None:
            r.first = Failure(r.name, canvas, step, row, position, detail)
        if not r.failing_steps or r.failing_steps[-1] != [canvas, step]:
            r.failing_steps.append([canvas, step])


def skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name, "skipped", reason=reason)


def _where(t: dict, r: int) -> tuple[int, int]:
    return int(t["canvas_index"][r]), int(t["step_index"][r])


def check_temperature(t: dict, settings: dict, tol: Tolerances) -> CheckResult:
    """T at each record against t_min + (t_max - t_min) * n / N, n the steps remaining (N at a canvas's first step)."""
    need = [k for k in ("t_min", "t_max", "max_denoising_steps") if settings.get(k) is None]
    if need:
        return skipped("temperature", f"manifest `generation_config` lacks {', '.join(need)}")
    N, lo, hi = int(settings["max_denoising_steps"]), float(settings["t_min"]), float(settings["t_max"])
    out = _Collector("temperature")
    for r in range(t["temperature"].shape[0]):
        c, s = _where(t, r)
        n = int(t["steps_remaining"][r])
        out.count()
        if s == 0 and n != N:
            out.fail(c, s, None, None, f"steps_remaining {n} at a canvas's first step, expected N = {N}")
            continue
        expected = float(temperature_at(n, N, lo, hi))
        got = float(t["temperature"][r])
        if abs(got - expected) > tol.temperature:
            out.fail(c, s, None, None, f"temperature {got:.6g}, the schedule gives {expected:.6g} (n = {n}, N = {N})")
    return out.result


def check_self_conditioning(t: dict, manifest: dict, tol: Tolerances) -> CheckResult:
    """At a canvas's first step no input (sc_present False, `sc_embedding` exactly zero), unless the caller seeded
    canvas 0; later, a row's recorded input is the previous step's recorded distribution (top-k ids and
    log-probs within tol.sc_logprob; ids may swap only between near-equal log-probs)."""
    out = _Collector("self_conditioning")
    seeded = bool(manifest.get("seeded_self_conditioning"))
    emb = t.get("sc_embedding")
    for r in range(t["active"].shape[0]):
        c, s = _where(t, r)
        active = t["active"][r]
        present = t["sc_present"][r]
        for b in torch.nonzero(active).view(-1).tolist():
            out.count()
            if s == 0 and not (seeded and c == 0):
                if bool(present[b]):
                    out.fail(c, s, b, None, "a self-conditioning input at a canvas's first step (none is due)")
                    continue
            if emb is not None and not bool(present[b]):
                worst = float(emb[r, b].abs().max())
                if worst > tol.sc_embedding:
                    pos = int(emb[r, b].abs().amax(dim=-1).argmax())
                    out.fail(c, s, b, pos, f"self-conditioning 'off' is not zero: |sc_embedding| up to {worst:.3g}")
                    continue
            if s == 0:
                continue
            if not bool(present[b]):
                out.fail(c, s, b, None, "no self-conditioning input after the canvas's first step")
                continue
            bad = _sc_mismatch(t["sc_ids"][r, b], t["sc_logprobs"][r, b], t["topk_ids"][r - 1, b],
                               t["topk_logprobs"][r - 1, b], tol.sc_logprob)
            if bad is not None:
                out.fail(c, s, b, bad[0], bad[1])
    return out.result


def _sc_mismatch(ids, lps, prev_ids, prev_lps, tol: float):
    """(position, detail) of the first position [L, k] whose input differs from the previous output, or None."""
    dv = (lps.double() - prev_lps.double()).abs()  # [L, k]
    gap = torch.full_like(dv, math.inf)  # distance of each previous log-prob to its neighbours
    gap[:, 1:] = (prev_lps[:, 1:] - prev_lps[:, :-1]).abs().double()
    gap[:, :-1] = torch.minimum(gap[:, :-1], (prev_lps[:, :-1] - prev_lps[:, 1:]).abs().double())
    swapped = (ids != prev_ids) & (gap > tol)
    bad = (dv > tol).any(dim=-1) | swapped.any(dim=-1)  # [L]
    if not bool(bad.any()):
        return None
    p = int(torch.nonzero(bad)[0])
    return p, (f"self-conditioning input differs from the previous step's distribution: max |dlogprob| "
               f"{float(dv[p].max()):.3g}, ids {ids[p].tolist()} vs {prev_ids[p].tolist()}")


def stopper_from(settings: dict):
    """The built-in stopper from the recorded thresholds, or None when they are not recorded."""
    if settings.get("stability_threshold") is None or settings.get("confidence_threshold") is None:
        return None
    from ..generation.stopping import StableAndConfidentStopperConfig

    return StableAndConfidentStopper(StableAndConfidentStopperConfig(int(settings["stability_threshold"]),
                                                                     float(settings["confidence_threshold"])))


def check_stop(t: dict, stopper, tol: Tolerances) -> CheckResult:
    """The recorded stop decision of each active row against `stopper` fed the recorded argmax canvases and
    entropies of the canvas so far (a row's mean entropy within tol.near_tie of the confidence threshold may go
    either way). `stopper`: a `Stopper` (None: skipped)."""
    if stopper is None:
        return skipped("stop", "manifest `generation_config` lacks stability_threshold / confidence_threshold")
    out = _Collector("stop")
    threshold = getattr(stopper, "confidence_threshold", None)
    B, L = t["argmax"].shape[1:]
    state, canvas = None, -1
    for r in range(t["active"].shape[0]):
        c, s = _where(t, r)
        if c != canvas:
            canvas, state = c, stopper.init_state(B, L, torch.device("cpu"))
        entropy = t["entropy"][r].float()
        stop, state = stopper(t["argmax"][r].long(), entropy, state)
        for b in torch.nonzero(t["active"][r]).view(-1).tolist():
            out.count()
            if bool(stop[b]) == bool(t["stopped"][r, b]):
                continue
            mean = float(entropy[b].double().mean())
            if threshold is not None and abs(mean - threshold) <= tol.near_tie * threshold:
                continue
            out.fail(c, s, b, None, f"recorded stopped={bool(t['stopped'][r, b])}, the stopper says {bool(stop[b])} "
                                    f"(mean entropy {mean:.4g})")
    return out.result


def _token_ids(value) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def check_commit(t: dict, settings: dict, prompt_length: int, canvas_length: int) -> CheckResult:
    """Each committed canvas against the argmax of its row's last active step (every sampler commits the argmax,
    spec D.4.5), with every token after the first EOS and every canvas of an earlier-finished row turned to pad
    (D.4.6; needs `eos_token_id` / `pad_token_id` from the manifest, else those rules are not applied)."""
    out = _Collector("commit")
    eos, pad = _token_ids(settings.get("eos_token_id")), settings.get("pad_token_id")
    seq = t["sequences"]
    B = seq.shape[0]
    canvases = (seq.shape[1] - prompt_length) // canvas_length
    ci = t["canvas_index"]
    for c in range(canvases):
        records = torch.nonzero(ci == c).view(-1).tolist()
        committed = seq[:, prompt_length + c * canvas_length: prompt_length + (c + 1) * canvas_length].long()
        for b in range(B):
            last = [r for r in records if bool(t["active"][r, b])]
            if last:
                expected = t["argmax"][last[-1], b].long()
            elif pad is not None:
                expected = torch.full((canvas_length,), int(pad), dtype=torch.long)
            else:
                continue
            if eos and pad is not None:
                expected = pad_after_eos(expected[None], torch.tensor(eos), int(pad))[0]
            out.count()
            diff = torch.nonzero(expected != committed[b]).view(-1)
            if diff.numel():
                p = int(diff[0])
                step = int(t["step_index"][last[-1]]) if last else -1
                out.fail(c, step, b, p, f"committed token {int(committed[b, p])}, the rule commits "
                                        f"{int(expected[p])} ({diff.numel()} of {canvas_length} positions differ)")
    return out.result


def check_renoise(t: dict, sampler_config, vocab_size: int | None, tol: Tolerances,
                  max_steps: int | None = None) -> CheckResult:
    """Positions not accepted at a step are fresh uniform noise in the next step's input canvas: the number of them
    that hold this step's argmax may exceed the binomial count of chance (1 / V) by at most tol.renoise_sigmas
    standard deviations (and 2 tokens), per row and step. Discrete DDIM keeps x_t on its "stay" route, so there the
    count is of refused positions that moved and hold x0 (the recorded `draw_ids`; skipped without them), at
    predictor steps only (a corrector pass resamples from the model, not from noise)."""
    from ..generation.discrete_ddim import DiscreteDDIMSamplerConfig, pass_schedule

    if vocab_size is None:
        return skipped("renoise", "manifest lacks `vocab_size` (chance of a noise token equal to the argmax)")
    ddim = isinstance(sampler_config, DiscreteDDIMSamplerConfig)
    if ddim and ("draw_ids" not in t or max_steps is None):
        return skipped("renoise", "discrete DDIM keeps the input token on its stay route: judging its noise needs "
                                  "the drawn x0 (`draw_ids`) and `max_denoising_steps`")
    schedule = pass_schedule(int(max_steps), sampler_config.corrector_steps) if ddim else None
    out = _Collector("renoise")
    p0 = 1.0 / vocab_size
    ci = t["canvas_index"]
    for r in range(t["active"].shape[0] - 1):
        if int(ci[r + 1]) != int(ci[r]):
            continue
        c, s = _where(t, r)
        if ddim and (s >= len(schedule) or schedule[s][1]):
            continue
        both = t["active"][r] & t["active"][r + 1]
        for b in torch.nonzero(both).view(-1).tolist():
            refused = ~t["accepted"][r, b]
            nxt = t["input_canvas"][r + 1, b]
            if ddim:  # the stay route keeps x_t: only the positions that moved were re-noised
                refused = refused & (nxt != t["input_canvas"][r, b])
            n = int(refused.sum())
            if n == 0:
                continue
            out.count()
            kept = refused & (nxt == (t["draw_ids"][r, b] if ddim else t["argmax"][r, b]))
            hits = int(kept.sum())
            limit = n * p0 + tol.renoise_sigmas * math.sqrt(n * p0 * (1 - p0)) + 2
            if hits > limit:
                what = "x0 (the draw)" if ddim else "this step's argmax"
                out.fail(c, s, b, int(torch.nonzero(kept)[0]),
                         f"{hits} of {n} non-accepted positions hold {what} in the next input "
                         f"(chance {n * p0:.2f}): not re-noised")
    return out.result


def run_checks(trace, sampler_config, stopper, tol: Tolerances) -> dict[str, CheckResult]:
    """Every algorithm check of a trace -> {name: CheckResult} in `CHECKS` order (without `model`).

    sampler_config: the recorded sampler's config (None: not recorded, acceptance and renoise skipped); stopper: the
    recorded stopper (None: stop skipped). A minimal trace skips them all; a missing field skips only its checks.
    """
    from .acceptance import check_acceptance

    names = CHECKS[1:]
    if trace.is_minimal:
        return {n: skipped(n, "minimal trace (no per-step records)") for n in names}
    if trace.is_mixed:  # every row is its own one-row trace (accuracy/rows.py)
        from .rows import checks_by_row

        return checks_by_row(trace, lambda one: run_checks(one, sampler_config, stopper, tol))
    t, m = trace.tensors, trace.manifest
    settings = m.get("generation_config") or {}
    no_sampler = "manifest `generation_config` lacks `sampler_config`"
    return {
        "temperature": check_temperature(t, settings, tol),
        "self_conditioning": check_self_conditioning(t, m, tol),
        "stop": check_stop(t, stopper, tol),
        "commit": check_commit(t, settings, trace.prompt_length, trace.canvas_length),
        "acceptance": (check_acceptance(t, sampler_config, tol, settings.get("max_denoising_steps"),
                                        m.get("vocab_size"))
                       if sampler_config is not None
                       else skipped("acceptance", no_sampler)),
        "renoise": (check_renoise(t, sampler_config, m.get("vocab_size"), tol, settings.get("max_denoising_steps"))
                    if sampler_config is not None
                    else skipped("renoise", no_sampler)),
    }


def recorded_sampler_config(manifest: dict):
    """The sampler config the manifest records (`generation_config.sampler_config`, `_cls_name` naming its class;
    without one, the entropy-bound config of older traces), or None when none is recorded."""
    from ..sampler_configs import sampler_config_class
    from .format import TraceFormatError

    saved = dict((manifest.get("generation_config") or {}).get("sampler_config") or {})
    if not saved:
        return None
    name = saved.pop("_cls_name", "EntropyBoundSamplerConfig")
    try:
        return sampler_config_class(name)(**saved)
    except (KeyError, TypeError, ValueError) as error:
        raise TraceFormatError(f"manifest `generation_config.sampler_config` ({name}) cannot be rebuilt: "
                               f"{error}") from None
