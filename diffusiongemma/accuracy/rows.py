"""Mixed-batch traces judged row by row: in the row pool every row is an independent sequence (no padding, its own
generator), so a mixed trace is one one-row lock-step trace per row (`Trace.row`). The replay and the algorithm
checks run on each of them as they run on any lock-step trace, and their results are put back together, naming each
row by its place in `sequences`.

Legend: B rows of the trace, R records.
"""

from dataclasses import replace

from .format import ROW_INDEX, Trace


def recorded_rows(trace: Trace) -> list[int]:
    """The rows of a mixed trace that have step records, in order (a row with none has nothing to compare)."""
    return sorted(set(trace.tensors[ROW_INDEX].tolist()))


def replay_rows(model, trace: Trace, replay_one) -> list:
    """`replay_one(model, row_trace)` for every recorded row -> its `StepScore`s, each naming its row."""
    scores = []
    for b in recorded_rows(trace):
        scores += [replace(s, row=b) for s in replay_one(model, trace.row(b))]
    return scores


def checks_by_row(trace: Trace, run_one) -> dict:
    """`run_one(row_trace)` -> {name: CheckResult} for every recorded row, merged into one result per check."""
    merged: dict = {}
    for b in recorded_rows(trace):
        for name, result in run_one(trace.row(b)).items():
            merged.setdefault(name, []).append((b, result))
    return {name: merge_results(name, parts) for name, parts in merged.items()}


def merge_results(name: str, parts: list):
    """One check's per-row results -> one `CheckResult`: it fails if any row fails (the first failure is the earliest
    canvas and step, its row renamed to the trace's), is skipped only if every row skipped it, else passes."""
    from .checks import CheckResult

    ran = [(b, r) for b, r in parts if r.status != "skipped"]
    if not ran:
        return CheckResult(name, "skipped", reason=parts[0][1].reason if parts else "no row has step records")
    out = CheckResult(name, "pass")
    firsts = []
    for b, r in ran:
        out.checked += r.checked
        out.failures += r.failures
        if r.first is not None:
            firsts.append(replace(r.first, row=b if r.first.row is not None else None))
        for step in r.failing_steps:
            if step not in out.failing_steps:
                out.failing_steps.append(step)
    if out.failures:
        out.status = "fail"
        out.first = min(firsts, key=lambda f: (f.canvas, f.step))
        out.failing_steps.sort()
    return out
