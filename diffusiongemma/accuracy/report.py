"""Judge replay scores against thresholds and present them: a table per canvas and step, or JSON.

Exit codes of `diffusiongemma compare`: 0 within the thresholds, 1 not, 2 a malformed trace.
"""

import math

from .replay import StepScore

DEFAULT_MIN_TOP1 = 0.99
DEFAULT_MAX_KL = 0.01


def step_fails(s: StepScore, min_top1: float | None, max_kl: float | None) -> bool:
    """A step fails when its top-1 agreement is below min_top1 or its mean KL above max_kl (NaN never fails)."""
    if s.rows == 0:
        return False
    return (min_top1 is not None and s.top1 < min_top1) or (max_kl is not None and not math.isnan(s.kl)
                                                           and s.kl > max_kl)


def model_check(scores: list[StepScore], min_top1: float | None, max_kl: float | None) -> dict:
    """The `model` check as the other checks report (accuracy/checks.py `CheckResult.as_dict`)."""
    failing = [s for s in scores if step_fails(s, min_top1, max_kl)]
    first = None
    if failing:
        f = failing[0]
        first = {"check": "model", "canvas": f.canvas, "step": f.step, "row": None, "position": None,
                 "detail": f"top1 {f.top1:.4f}, KL {f.kl:.3e} (thresholds min_top1 {min_top1}, max_kl {max_kl})"}
    return {"name": "model", "status": "fail" if failing else "pass", "checked": sum(1 for s in scores if s.rows),
            "failures": len(failing), "first": first, "reason": "",
            "failing_steps": [[s.canvas, s.step] for s in failing]}


def summarize(scores: list[StepScore], minimal: bool, min_top1: float | None, max_kl: float | None,
              verdicts: dict | None = None) -> dict:
    """Per-canvas aggregates, the worst step, the verdict of every check (`model` and the algorithm checks of
    `verdicts`, name -> checks.CheckResult), the first failure (earliest canvas and step), and the overall verdict."""
    canvases = {}
    for s in scores:
        entry = canvases.setdefault(s.canvas, {"canvas": s.canvas, "steps": 0, "failing_steps": 0, "top1_min": 1.0,
                                               "kl_max": 0.0})
        entry["steps"] += 1
        entry["failing_steps"] += step_fails(s, min_top1, max_kl)
        if s.rows:
            entry["top1_min"] = min(entry["top1_min"], s.top1)
            if not math.isnan(s.kl):
                entry["kl_max"] = max(entry["kl_max"], s.kl)
    counted = [s for s in scores if s.rows]
    worst = min(counted, key=lambda s: (s.top1, -(0.0 if math.isnan(s.kl) else s.kl)), default=None)
    checks = {"model": model_check(scores, min_top1, max_kl)}
    checks.update({name: result.as_dict() for name, result in (verdicts or {}).items()})
    for name, check in checks.items():
        for c, _ in check["failing_steps"]:
            if c in canvases and name != "model":
                canvases[c]["failing_steps"] += 1
    failing = sorted({c for check in checks.values() for c, _ in check["failing_steps"]})
    firsts = [ch["first"] for ch in checks.values() if ch["first"] is not None]
    first = min(firsts, key=lambda f: (f["canvas"], f["step"]), default=None)
    return {
        "mode": "minimal" if minimal else "full",
        "thresholds": {"min_top1": min_top1, "max_kl": max_kl},
        "passed": not failing and first is None,
        "first_failure": first,
        "failed_checks": [n for n, ch in checks.items() if ch["status"] == "fail"],
        "skipped_checks": {n: ch["reason"] for n, ch in checks.items() if ch["status"] == "skipped"},
        "partial_checks": {n: ch["reason"] for n, ch in checks.items() if ch["status"] != "skipped" and ch["reason"]},
        "checks": checks,
        "first_failing_canvas": failing[0] if failing else None,
        "failing_canvases": failing,
        "worst_step": worst.as_dict() if worst is not None else None,
        "canvases": [canvases[c] for c in sorted(canvases)],
        "steps": [s.as_dict() for s in scores],
    }


def _num(x: float, width: int, digits: int, sci: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-".rjust(width)
    return (f"{x:.{digits}e}" if sci else f"{x:.{digits}f}").rjust(width)


def format_table(summary: dict) -> str:
    """The human-readable report: one line per step (grouped by canvas; `!` marks a failing step), then the worst
    step and the verdict."""
    th = summary["thresholds"]
    minimal = summary["mode"] == "minimal"
    lines = []
    if minimal:
        lines.append("minimal trace: each committed canvas scored as a denoising fixed point (no self-conditioning, "
                     "T = 1)")
        lines.append("canvas  rows  argmax-agree  mean-entropy")
        for s in summary["steps"]:
            bad = "!" if th["min_top1"] is not None and s["top1"] < th["min_top1"] else " "
            lines.append(f"{s['canvas']:>6}{bad} {s['rows']:>4}  {_num(s['top1'], 12, 4)}  "
                         f"{_num(s['mean_entropy'], 12, 4)}")
    else:
        by_row = any(s.get("row") is not None for s in summary["steps"])  # a mixed trace: one row per line
        lines.append(("  row " if by_row else "") + "canvas  step  rows    top1        KL    KL-max  max|dlogp|  accept"
                     "    stop  entropy  sc-rec  sc-ours  sc-same")
        for s in summary["steps"]:
            failing = s["rows"] and ((th["min_top1"] is not None and s["top1"] < th["min_top1"])
                                     or (th["max_kl"] is not None and s["kl"] > th["max_kl"]))
            lines.append(
                (f"{s['row']:>5} " if by_row else "") + f"{s['canvas']:>6}{'!' if failing else ' '}{s['step']:>5}  {s['rows']:>4}  {_num(s['top1'], 6, 4)}  "
                f"{_num(s['kl'], 8, 1, True)}  {_num(s['kl_max'], 8, 1, True)}  {_num(s['max_dlogprob'], 10, 2, True)}"
                f"  {_num(s['accepted'], 6, 3)}  {_num(s['stop'], 6, 3)}  {_num(s['mean_entropy'], 7, 3)}"
                f"  {_num(s.get('sc_record'), 6, 3)}  {_num(s.get('sc_ours'), 7, 3)}  {_num(s.get('sc_matched'), 7, 3)}"
            )
    if not minimal:
        lines.append("sc-rec / sc-ours: share of each step's self-conditioning mass from the record's top-k / from our "
                     "previous step; sc-same: share of positions where the record equals our previous step (our own "
                     "input fed)")
    w = summary["worst_step"]
    if w is not None:
        where = f"canvas {w['canvas']}" + ("" if w["step"] < 0 else f", step {w['step']}")
        lines.append(f"worst step: {where} (top1 {w['top1']:.4f}" + ("" if minimal else f", KL {w['kl']:.3e}") + ")")
    for name, check in summary.get("checks", {}).items():
        extra = (f" ({check['reason']})" if check["status"] == "skipped"
                 else f", {check['failures']} failing of {check['checked']}" if check["status"] == "fail" else "")
        if check["status"] != "skipped" and check["reason"]:  # a partial check says what it could not judge
            extra += f" ({check['reason']})"
        lines.append(f"check {name:<18} {check['status'].upper()}{extra}")
    first = summary.get("first_failure")
    if first is not None:
        lines.append(f"first failure: check {first['check']} at canvas {first['canvas']}, step {first['step']}, row "
                     f"{first['row']}, position {first['position']}: {first['detail']}")
    shown = {k: v for k, v in th.items() if v is not None}
    if summary["passed"]:
        lines.append(f"PASS: every step within {shown or 'no thresholds'}")
    else:
        lines.append(f"FAIL: checks {summary.get('failed_checks', ['model'])} fail (model thresholds {shown}); "
                     f"canvases {summary['failing_canvases']}, first divergence at canvas "
                     f"{summary['first_failing_canvas']}")
    return "\n".join(lines)
