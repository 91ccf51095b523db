"""The test behind `compare --engine-url`: a stratified difference of means with a Welch t statistic.

Each prompt p contributes d_p = mean(engine_p) - mean(reference_p) with variance v_p = s2_E/n_E + s2_R/n_R (sample
variances). d = mean_p d_p, SE = sqrt(sum_p v_p) / P, t = d / SE, with Welch-Satterthwaite degrees of freedom
df = (sum w)^2 / sum(w^2 / (n - 1)) over every component w = s2 / n. The one-sided p-value P(T_df <= t) comes from
the regularized incomplete beta function (no scipy needed). A t rather than a normal quantile matters here: with a
few samples per prompt the variances are themselves noisy and z-thresholds fire far more often than they claim.
"""

import math


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz), for x < (a + 1) / (a + b + 2)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b). Example: I_0.5(1, 1) = 0.5."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom. Example: t_cdf(0, 5) = 0.5; t_cdf(-2.015, 5) = 0.05."""
    if math.isinf(t):
        return 0.0 if t < 0 else 1.0
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return tail if t < 0 else 1 - tail


def t_quantile(p: float, df: float) -> float:
    """The t with t_cdf(t, df) = p (bisection), for the confidence interval."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def stratified_test(groups: list[tuple[list[float], list[float]]]) -> dict:
    """groups: per prompt (engine values, reference values), each side with >= 1 value.

    Returns difference d, se, t, df, p_value (one-sided, engine worse), ci95 (t-based), prompts. A side with one
    value borrows the pooled variance of that side. se 0 (no variance anywhere): t is +-inf (0 when d = 0), p 0 or 1.
    """
    def var(xs):
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else math.nan

    used = [(e, r) for e, r in groups if e and r]
    if not used:
        return {"difference": None, "se": None, "t": None, "df": None, "p_value": None, "ci95": None, "prompts": 0}
    pooled = [var([x for g in used for x in g[side]] or [0.0]) for side in (0, 1)]
    diffs, parts = [], []  # parts: (s2 / n, n - 1) per side and prompt
    for e, r in used:
        diffs.append(sum(e) / len(e) - sum(r) / len(r))
        for side, xs in enumerate((e, r)):
            v = var(xs)
            v = pooled[side] if math.isnan(v) else v
            v = 0.0 if math.isnan(v) else v
            parts.append((v / len(xs), max(len(xs) - 1, 1)))
    P = len(used)
    d = sum(diffs) / P
    total = sum(w for w, _ in parts)
    se = math.sqrt(total) / P
    if se == 0:
        t = 0.0 if d == 0 else math.copysign(math.inf, d)
        return {"difference": d, "se": 0.0, "t": t, "df": None, "p_value": 0.0 if d < 0 else (0.5 if d == 0 else 1.0),
                "ci95": [d, d], "prompts": P}
    df = total ** 2 / sum(w * w / n for w, n in parts if w > 0)
    t = d / se
    q = t_quantile(0.975, df)
    return {"difference": d, "se": se, "t": t, "df": df, "p_value": t_cdf(t, df), "ci95": [d - q * se, d + q * se],
            "prompts": P}
