"""The verdict of `compare --engine-url` (accuracy/engine_compare.py) from the scored answers: the stratified
difference of the mean log-probabilities, its non-inferiority p-value, the run's minimum detectable difference, and
"pass" / "fail" / "inconclusive" (docs/reference-accuracy.md, "Checking a running server").
"""

import math

from .stats import stratified_test, t_cdf, t_quantile

ALPHA = 0.001  # one-sided false-alarm probability of the t-test for an agreeing engine
MARGIN = 0.02  # nats per token: differences below this are rounding (bf16 engines), never a failure
POWER = 0.8  # the probability with which the run must be able to find a deficit of MAX_DETECTABLE
MAX_DETECTABLE = 0.25  # nats per token: a run that could not find a deficit this large is inconclusive (exit 3);
# the Sudoku model's agreeing runs at the default sample counts reach 0.10 (benchmarks/engine_compare_calibration.py)


def stratified_difference(engine: list, reference: list, field: str) -> dict:
    """`stats.stratified_test` of `field` grouped by prompt (NaN scores, i.e. empty answers, left out)."""
    def values(scores, p):
        return [getattr(s, field) for s in scores if s.prompt == p and not math.isnan(getattr(s, field))]

    prompts = sorted({s.prompt for s in engine} & {s.prompt for s in reference})
    return stratified_test([(values(engine, p), values(reference, p)) for p in prompts])


def side_summary(scores: list) -> dict:
    def mean(field):
        xs = [getattr(s, field) for s in scores if not math.isnan(getattr(s, field))]
        return sum(xs) / len(xs) if xs else None

    return {"answers": len(scores), "scored": sum(not math.isnan(s.mean_logprob) for s in scores),
            "mean_logprob": mean("mean_logprob"), "argmax_agree": mean("argmax_agree"),
            "mean_tokens": sum(s.tokens for s in scores) / len(scores) if scores else None}


def margin_p_value(logprob: dict, margin: float = MARGIN) -> float | None:
    """One-sided p-value of "the engine is at most `margin` nats per token worse" (H0: true d >= -margin), from the
    stratified difference's d, SE and df: P(T_df <= (d + margin) / SE). None without a difference."""
    d, se = logprob["difference"], logprob["se"]
    if d is None:
        return None
    if not se:  # no variance anywhere: decided by d alone
        return 0.0 if d < -margin else 1.0
    return t_cdf((d + margin) / se, logprob["df"])


def verdict(logprob: dict) -> bool:
    """True unless the engine is significantly worse than the reference by more than MARGIN: the
    non-inferiority p-value `margin_p_value` is below ALPHA (which also needs d < -MARGIN)."""
    p = margin_p_value(logprob)
    return p is not None and p >= ALPHA


def detectable_difference(logprob: dict, power: float = POWER) -> float | None:
    """The minimum detectable difference (nats per token): the smallest true deficit |d| the test finds with
    probability `power`, MARGIN + (t_{1-ALPHA} + t_{power}) * SE at the run's df (MARGIN when SE is 0, where d alone
    decides). None without a difference.

    Example: SE 0.072, df 10: 0.02 + (4.144 + 0.879) * 0.072 = 0.38 nats per token."""
    se, df = logprob["se"], logprob["df"]
    if logprob["difference"] is None:
        return None
    if not se:
        return MARGIN
    return MARGIN + (t_quantile(1 - ALPHA, df) + t_quantile(power, df)) * se


def verdict_of(logprob: dict, max_detectable: float = MAX_DETECTABLE) -> str:
    """"fail" when the engine is significantly worse (`verdict`), else "inconclusive" when the run could not have
    found a deficit of `max_detectable` (`logprob["detectable"]` above it, or no difference at all), else "pass"."""
    if not verdict(logprob) and logprob["difference"] is not None:
        return "fail"
    detectable = logprob.get("detectable")
    if detectable is None or detectable > max_detectable:
        return "inconclusive"
    return "pass"
