"""What `compare --engine-url` sees of each planted bug from answers alone (the catch table's last column,
docs/reference-accuracy.md; issue 37).

For the clean loop and each bug of the mutation suite, the foreign engine loop (tests/accuracy/foreign_engine.py:
transformers' built-in class under an independent loop, with the bug planted) is served behind a minimal
OpenAI-compatible completions endpoint on loopback, and `diffusiongemma compare --engine-url` is run against it at
default flags (4 samples per prompt, --max-tokens 32), plus once with --max-tokens 164 (two canvases asked for).
The reference is the bundled Sudoku model (for the window bug, a copy with its sliding window cut to 64, so that a
window of W instead of W - 1 binds on the prompt); the perturbed-weight row serves the clean loop on a copy with one
attention output projection perturbed. Prints one table row per bug: exit status, verdict, the mean per-token
log-prob difference d (engine - reference) with its p, and both sides' argmax agreement.

    PYTHONPATH=. python benchmarks/engine_url_catch.py [--prompts 3] [--bugs commit_shifted,...] [--json]
"""

import argparse
import contextlib
import io
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "accuracy"))
from foreign_engine import BUGS, ForeignEngineServer, perturbed

from diffusiongemma.cli import main
from diffusiongemma.sudoku import make_puzzle
from diffusiongemma.sudoku.demo import DEMO_MODEL
from diffusiongemma.sudoku.tokenizer import sudoku_tokenizer

ROWS = ("clean", *BUGS, "perturbed_weight")


def write_prompts(path: Path, n: int) -> None:
    rng = random.Random(0)
    path.write_text("".join(f"<bos>{make_puzzle(rng, 45)[0].replace('0', '.')}|\n" for _ in range(n)))


def windowed_copy(root: Path) -> Path:
    folder = root / "window64"
    shutil.copytree(DEMO_MODEL, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["sliding_window"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    return folder



def compare(reference: Path, url: str, prompts: Path, *extra: str) -> tuple[int, dict]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["compare", "--model", str(reference), "--engine-url", url, "--prompts", str(prompts), "--json",
                     *extra])
    text = out.getvalue()
    return code, (json.loads(text) if text.strip().startswith("{") else {"error": err.getvalue().strip()[-300:]})


def summary_of(code: int, s: dict) -> dict:
    if "error" in s:
        return {"exit": code, "error": s["error"]}
    d = s["logprob_difference"]
    return {"exit": code, "verdict": s["verdict"], "d": d["difference"], "p": d["p_value"],
            "argmax_engine": s["engine"]["argmax_agree"], "argmax_reference": s["reference"]["argmax_agree"]}


def cell(r: dict) -> str:
    if "error" in r:
        return f"exit {r['exit']}: {r['error']}"
    return (f"exit {r['exit']} {r['verdict']}, d {r['d']:+.3g} (p {r['p']:.2g}), argmax {r['argmax_engine']:.2f} vs "
            f"{r['argmax_reference']:.2f}")


def main_(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=3, help="Sudoku puzzles (45 givens), one prompt each")
    p.add_argument("--bugs", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = [b for b in args.bugs.split(",") if b]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        p.error(f"--bugs: unknown {unknown}; known: {list(ROWS)}")
    torch.set_num_threads(1)
    tokenizer = sudoku_tokenizer()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prompts = root / "puzzles.txt"
        write_prompts(prompts, args.prompts)
        window = windowed_copy(root) if "window_w" in rows else None
        builtin = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()
        for bug in rows:
            reference, model = DEMO_MODEL, builtin
            if bug == "window_w":
                reference = window
                model = type(builtin).from_pretrained(window, dtype=torch.float32).eval()
            elif bug == "perturbed_weight":
                model = perturbed(builtin)
            server = ForeignEngineServer(model, tokenizer, None if bug in ("clean", "perturbed_weight") else bug)
            try:
                start = time.perf_counter()
                default = summary_of(*compare(reference, server.url, prompts))
                two = summary_of(*compare(reference, server.url, prompts, "--max-tokens", "164"))
                results[bug] = {"default": default, "max_tokens_164": two, "seconds": time.perf_counter() - start}
            finally:
                server.stop()
            print(f"{bug}: {cell(default)} | --max-tokens 164: {cell(two)}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    print("| bug | compare --engine-url, default flags | --max-tokens 164 |")
    print("| --- | --- | --- |")
    for bug, r in results.items():
        print(f"| {bug} | {cell(r['default'])} | {cell(r['max_tokens_164'])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main_())
