"""KL of FP8-dynamic and NVFP4 against their source on the test fixtures (issue 37, README "Quantized ...").

Builds two tiny checkpoints the tests build: `tiny`, the source of tests/quantization/test_quantize.py
(`tiny_model(seed=11)` + the character tokenizer of tests/conftest.py; random, so nearly flat: most positions are
near ties), and `tiny-sharp`, the serving tests' model (tests/accuracy/test_engine_compare.py: `tiny_model()` with
its tied LM head scaled by 30, so it has clear top-1 tokens). Quantizes each with `diffusiongemma quantize --scheme
fp8-dynamic` and `--scheme nvfp4`, runs `diffusiongemma kl --base SRC --model DST` on each pair, and prints one table
row per fixture and scheme (and the JSON with --json). Everything is built offline in a temporary folder (or --out
DIR, kept).

    PYTHONPATH=. python benchmarks/kl_fixtures.py [--samples 4] [--max-tokens 32] [--steps 4] [--out DIR] [--json]
"""

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # conftest's fixture builders

from conftest import tiny_model, tiny_tokenizer

from diffusiongemma.cli import main

PROMPTS = ["Hello there", "The quick brown fox", "jumps over the lazy dog", "0123456789", "Once upon a time",
           "diffusion", "a b c d e f", "What is the answer?"]
SCHEMES = ("fp8-dynamic", "nvfp4")
FIXTURES = ("tiny", "tiny-sharp")


def source_model(fixture: str):
    if fixture == "tiny":
        return tiny_model(seed=11)
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # tied: the embeddings scale too, as in the serving tests' fixture
    return model


def build_fixtures(root: Path, fixture: str) -> dict[str, Path]:
    """The source checkpoint and its two quantized copies -> {"source": ..., scheme: ...}."""
    root.mkdir(parents=True, exist_ok=True)
    src = root / "source"
    source_model(fixture).save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    paths = {"source": src}
    for scheme in SCHEMES:
        dst = root / scheme
        with contextlib.redirect_stdout(io.StringIO()):
            if main(["quantize", "--scheme", scheme, str(src), str(dst)]) != 0:
                raise SystemExit(f"diffusiongemma quantize --scheme {scheme} failed")
        paths[scheme] = dst
    return paths


def kl_report(base: Path, model: Path, prompts: Path, samples: int, max_tokens: int, steps: int) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["kl", "--base", str(base), "--model", str(model), "--prompts", str(prompts), "--samples",
                     str(samples), "--max-tokens", str(max_tokens), "--steps", str(steps), "--json"])
    if code != 0:
        raise SystemExit(f"diffusiongemma kl exited {code} on {model}")
    return json.loads(out.getvalue())


def row(name: str, r: dict) -> str:
    lo, hi = r["kl_ci95"]
    q = r["kl_quantiles"]
    top1 = "n/a" if r["top1_agreement"] is None else f"{100 * r['top1_agreement']:.2f} %"
    return (f"| {name} | {r['kl_mean']:.3g} [{lo:.3g}, {hi:.3g}] | {q['99']:.3g} / {q['max']:.3g} | {top1} | "
            f"{r['dp_rms']:.3g} | {r['positions']} ({r['near_ties']} near ties, {r['near_tie_flips']} flipped) |")


def main_(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", type=Path, default=None, help="keep the fixtures here (default: a temporary folder)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        prompts = root / "prompts.txt"
        prompts.write_text("".join(f"{line}\n" for line in PROMPTS))
        reports = {}
        for fixture in FIXTURES:
            paths = build_fixtures(root / fixture, fixture)
            for s in SCHEMES:
                reports[f"{fixture} {s}"] = kl_report(paths["source"], paths[s], prompts, args.samples,
                                                      args.max_tokens, args.steps)
    if args.json:
        print(json.dumps(reports, indent=2))
    print("| fixture, scheme | kl_mean [95% CI] | KL p99 / max | top1_agreement | dp_rms | positions |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in reports.items():
        print(row(name, r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main_())
