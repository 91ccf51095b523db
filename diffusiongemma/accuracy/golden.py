"""Golden outputs for another engine's CI: per prompt, the reference-mode tokens, text, denoising steps per canvas,
tokens per forward, and a compact logit fingerprint (the first step's top-k per position). `check_golden` re-runs
them and names the first divergence.

Legend: L canvas length, k fingerprint width.
"""

import json
import math
import os
from pathlib import Path

import torch

FINGERPRINT_K = 4
LOGPROB_TOLERANCE = 1e-3  # fingerprint log-probs are compared within this (they are rounded to 5 decimals)
TOKENS_PER_FORWARD_TOLERANCE = 2e-6  # written rounded to 6 decimals
TEMPERATURE_TOLERANCE = 2e-6  # written rounded to 6 decimals
JUDGED = ("temperature", "stop", "commit")  # algorithm checks (accuracy/checks.py) run on every re-run


def golden_record(model, tokenizer, prompt: str, seed: int, max_new_tokens: int | None, steps: int | None) -> dict:
    """One prompt's golden record in reference sampling mode (global RNG seeded with `seed`, batch of 1)."""
    return golden_run(model, tokenizer, prompt, seed, max_new_tokens, steps)[0]


def golden_run(model, tokenizer, prompt: str, seed: int, max_new_tokens: int | None, steps: int | None):
    """(golden record, the run's trace)."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(next(model.parameters()).device)
    overrides = {}
    if max_new_tokens is not None:
        overrides["max_new_tokens"] = max_new_tokens
    if steps is not None:
        overrides["max_denoising_steps"] = steps
    torch.manual_seed(seed)
    out = model.generate(ids, return_trace=True, trace_top_k=FINGERPRINT_K, **overrides)
    trace = out.trace
    new = out.sequences[0, ids.shape[1]:].tolist()
    first = trace.steps(0)[0]
    temperature = trace.tensors["temperature"]
    return {
        "prompt": prompt,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "max_denoising_steps": steps,
        "tokens": new,
        "text": tokenizer.decode(new, skip_special_tokens=True),
        "steps_per_canvas": [len(trace.steps(c)) for c in range(trace.num_canvases)],
        "tokens_per_forward": round(float(out.tokens_per_forward[0]), 6),
        # each canvas's temperature per step (the schedule an engine must follow; older files lack it)
        "temperatures": [[round(float(temperature[r]), 6) for r in trace.steps(c).tolist()]
                         for c in range(trace.num_canvases)],
        "fingerprint": {
            "ids": trace.tensors["topk_ids"][first, 0].tolist(),  # [L, k]
            "logprobs": [[round(x, 5) for x in row] for row in trace.tensors["topk_logprobs"][first, 0].tolist()],
        },
    }, trace


def write_golden(model, tokenizer, prompts: list[str], path, seed: int, max_new_tokens=None, steps=None) -> list:
    """Write one JSON line per prompt to `path` (whole or not at all: a temporary sibling renamed into place);
    returns the records."""
    if not prompts:
        raise ValueError("no prompts to write golden records for")
    records = [golden_record(model, tokenizer, p, seed, max_new_tokens, steps) for p in prompts]
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        temporary.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return records


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def record_problem(record) -> str | None:
    """What makes `record` not a golden record (None when it is one): each field's type and the fingerprint's
    shape ([L][k] ids and finite log-probs <= 0)."""
    if not isinstance(record, dict):
        return "is not a JSON object"
    missing = [k for k in ("prompt", "seed", "tokens", "steps_per_canvas", "tokens_per_forward", "fingerprint")
               if k not in record]
    if missing:
        return f"lacks {missing}"
    if not isinstance(record["prompt"], str) or not record["prompt"]:
        return f"`prompt` must be a non-empty string, got {record['prompt']!r}"
    if not _is_int(record["seed"]) or not 0 <= record["seed"] < 2**32:
        return f"`seed` must be an int in [0, 2**32 - 1], got {record['seed']!r}"
    for key in ("max_new_tokens", "max_denoising_steps"):
        if record.get(key) is not None and (not _is_int(record[key]) or record[key] <= 0):
            return f"`{key}` must be a positive int or null, got {record[key]!r}"
    if not isinstance(record["tokens"], list) or not all(_is_int(t) and t >= 0 for t in record["tokens"]):
        return "`tokens` must be a list of token ids (ints >= 0)"
    steps = record["steps_per_canvas"]
    if not isinstance(steps, list) or not steps or not all(_is_int(n) and n > 0 for n in steps):
        return f"`steps_per_canvas` must be a non-empty list of positive ints, got {steps!r}"
    if not _is_number(record["tokens_per_forward"]) or record["tokens_per_forward"] <= 0:
        return f"`tokens_per_forward` must be a finite number > 0, got {record['tokens_per_forward']!r}"
    temps = record.get("temperatures")
    if temps is not None and (not isinstance(temps, list) or len(temps) != len(steps) or not all(
            isinstance(t, list) and len(t) == n and all(_is_number(x) and x > 0 for x in t)
            for t, n in zip(temps, steps))):
        return "`temperatures` must hold, per canvas, one number > 0 per denoising step (`steps_per_canvas`)"
    fp = record["fingerprint"]
    if not isinstance(fp, dict) or not isinstance(fp.get("ids"), list) or not isinstance(fp.get("logprobs"), list):
        return "`fingerprint` must be an object with `ids` and `logprobs` lists"
    ids, logprobs = fp["ids"], fp["logprobs"]
    if not ids or len(ids) != len(logprobs):
        return f"`fingerprint` needs one row of ids and log-probs per position, got {len(ids)} and {len(logprobs)}"
    for pos, (i, lp) in enumerate(zip(ids, logprobs)):
        if not isinstance(i, list) or not isinstance(lp, list) or len(i) != FINGERPRINT_K or len(lp) != len(i):
            return f"`fingerprint` position {pos} must hold {FINGERPRINT_K} ids and {FINGERPRINT_K} log-probs"
        if not all(_is_int(x) and x >= 0 for x in i):
            return f"`fingerprint.ids` position {pos} holds {i}: token ids are ints >= 0"
        if not all(_is_number(x) and x <= 1e-4 for x in lp):
            return f"`fingerprint.logprobs` position {pos} holds {lp}: log-probs are finite numbers <= 0"
    return None


def read_golden(path) -> list[dict]:
    """The records of a golden file (ValueError naming the line when one is not a golden record)."""
    records = []
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file (golden files are UTF-8 JSON lines)") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n} is not JSON: {e}") from None
        problem = record_problem(record)
        if problem:
            raise ValueError(f"{path}:{n} is not a golden record: {problem}")
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no golden records (it is empty or blank)")
    return records


def first_divergence(expected: dict, got: dict, tokenizer, L: int) -> str | None:
    """A readable description of where two golden records first differ, or None when they agree."""
    a, b = expected["tokens"], got["tokens"]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return (f"token {i} (canvas {i // L}, position {i % L}): expected {x} {tokenizer.decode([x])!r}, got {y} "
                    f"{tokenizer.decode([y])!r}\n  expected text: {expected.get('text')!r}\n  got text:      "
                    f"{got['text']!r}")
    if len(a) != len(b):
        return f"length: expected {len(a)} new tokens, got {len(b)}"
    if expected["steps_per_canvas"] != got["steps_per_canvas"]:
        return f"denoising steps per canvas: expected {expected['steps_per_canvas']}, got {got['steps_per_canvas']}"
    if expected.get("temperatures") is not None:
        for c, (ta, tb) in enumerate(zip(expected["temperatures"], got["temperatures"])):
            bad = [i for i, (x, y) in enumerate(zip(ta, tb)) if abs(x - y) > TEMPERATURE_TOLERANCE]
            if bad:
                return (f"temperature at canvas {c}, step {bad[0]}: expected {ta[bad[0]]}, got {tb[bad[0]]} "
                        f"(schedules {ta} vs {tb})")
    if abs(expected["tokens_per_forward"] - got["tokens_per_forward"]) > TOKENS_PER_FORWARD_TOLERANCE:
        return f"tokens per forward: expected {expected['tokens_per_forward']}, got {got['tokens_per_forward']}"
    fa, fb = expected["fingerprint"], got["fingerprint"]
    if len(fa["ids"]) != len(fb["ids"]):
        return f"fingerprint: expected {len(fa['ids'])} positions, got {len(fb['ids'])} (one per canvas position)"
    for pos, (ia, ib) in enumerate(zip(fa["ids"], fb["ids"])):
        if ia != ib:
            return f"fingerprint (first step's top-{len(ia)}) at position {pos}: expected ids {ia}, got {ib}"
    for pos, (la, lb) in enumerate(zip(fa["logprobs"], fb["logprobs"])):
        delta = max(abs(x - y) for x, y in zip(la, lb))
        if delta > LOGPROB_TOLERANCE or any(math.isnan(x) for x in lb):
            return (f"fingerprint log-probs at position {pos}: expected {la}, got {lb} (max |delta| {delta:.2e} > "
                    f"{LOGPROB_TOLERANCE})")
    return None


def check_golden(model, tokenizer, path, seed: int | None = None) -> list[tuple[int, str]]:
    """Re-run every record of a golden file (with its own seed unless `seed` overrides it) -> [(record index,
    first divergence)] for the records that differ (empty when all agree)."""
    from .checks import Tolerances, run_checks, stopper_from

    problems = []
    for i, expected in enumerate(read_golden(path)):
        got, trace = golden_run(model, tokenizer, expected["prompt"], expected["seed"] if seed is None else seed,
                                expected.get("max_new_tokens"), expected.get("max_denoising_steps"))
        diff = first_divergence(expected, got, tokenizer, model.canvas_length)
        if diff is None:  # the re-run itself must follow the rules: temperature schedule, stopping, commit
            settings = trace.manifest.get("generation_config") or {}
            stopper = None if settings.get("stopper_config") else stopper_from(settings)
            results = run_checks(trace, None, stopper, Tolerances())
            failed = [results[name].first for name in JUDGED if results[name].status == "fail"]
            if failed:
                f = failed[0]
                diff = (f"check {f.check} at canvas {f.canvas}, step {f.step}, row {f.row}, position {f.position}: "
                        f"{f.detail}")
        if diff is not None:
            problems.append((i, diff))
    return problems
