"""Golden outputs for another engine's CI: per prompt, the reference-mode tokens, text, denoising steps per canvas,
tokens per forward, and a compact logit fingerprint (the first step's top-k per position). `check_golden` re-runs
them and names the first divergence.

Legend: L canvas length, k fingerprint width.
"""

import json
import math
from pathlib import Path

import torch

FINGERPRINT_K = 4
LOGPROB_TOLERANCE = 1e-3  # fingerprint log-probs are compared within this (they are rounded to 5 decimals)


def golden_record(model, tokenizer, prompt: str, seed: int, max_new_tokens: int | None, steps: int | None) -> dict:
    """One prompt's golden record in reference sampling mode (global RNG seeded with `seed`, batch of 1)."""
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
    return {
        "prompt": prompt,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "max_denoising_steps": steps,
        "tokens": new,
        "text": tokenizer.decode(new, skip_special_tokens=True),
        "steps_per_canvas": [len(trace.steps(c)) for c in range(trace.num_canvases)],
        "tokens_per_forward": round(float(out.tokens_per_forward[0]), 6),
        "fingerprint": {
            "ids": trace.tensors["topk_ids"][first, 0].tolist(),  # [L, k]
            "logprobs": [[round(x, 5) for x in row] for row in trace.tensors["topk_logprobs"][first, 0].tolist()],
        },
    }


def write_golden(model, tokenizer, prompts: list[str], path, seed: int, max_new_tokens=None, steps=None) -> list:
    """Write one JSON line per prompt to `path`; returns the records."""
    records = [golden_record(model, tokenizer, p, seed, max_new_tokens, steps) for p in prompts]
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def read_golden(path) -> list[dict]:
    """The records of a golden file (ValueError naming the line when one is not a golden record)."""
    records = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n} is not JSON: {e}") from None
        missing = [k for k in ("prompt", "seed", "tokens", "steps_per_canvas", "fingerprint") if k not in record]
        if missing:
            raise ValueError(f"{path}:{n} lacks {missing}")
        records.append(record)
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
    fa, fb = expected["fingerprint"], got["fingerprint"]
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
    problems = []
    for i, expected in enumerate(read_golden(path)):
        got = golden_record(model, tokenizer, expected["prompt"], expected["seed"] if seed is None else seed,
                            expected.get("max_new_tokens"), expected.get("max_denoising_steps"))
        diff = first_divergence(expected, got, tokenizer, model.canvas_length)
        if diff is not None:
            problems.append((i, diff))
    return problems
