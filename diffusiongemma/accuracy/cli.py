"""The `trace`, `compare` and `golden` commands (docs/reference-accuracy.md).

    diffusiongemma trace --model PATH (--prompt TEXT | --prompts FILE) --out DIR [--seed S] [--top-k K] ...
    diffusiongemma compare --model PATH --trace DIR [--json] [--min-top1 X] [--max-kl X]     exit 0 / 1 / 2
    diffusiongemma compare --model PATH --engine-url URL --prompts FILE [--chat] [--samples N] ...  exit 0 / 1 / 2 / 3
    diffusiongemma golden --model PATH --prompts FILE --out FILE.jsonl [--seed S]
    diffusiongemma golden --check FILE.jsonl --model PATH [--seed S]                         exit 0 / 1
"""

import json
import sys
from pathlib import Path

from ..cli_types import bounded_float, seed_arg, steps_arg

_fraction = bounded_float(0, 1)
_non_negative = bounded_float(0)


def _positive_int(text: str) -> int:
    from ..cli_types import positive_int

    return positive_int(text)


def _load(args):
    from transformers import AutoTokenizer

    from ..cli_types import dtype_arg as _dtype
    from ..model import DiffusionGemmaForBlockDiffusion

    dtype = _dtype(args.dtype)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    model.get_decoder().decoder_window = args.decoder_window  # a semantics switch; "reference" by default
    return model, AutoTokenizer.from_pretrained(args.model)


def read_prompts(path) -> list[str]:
    """One prompt per line (blank lines skipped); a `.jsonl` file holds objects with a non-empty string "prompt".

    Raises:
        ValueError: naming the file and line of a line that is not such an object.
    """
    text = Path(path).read_text()
    if not str(path).endswith(".jsonl"):
        return [line for line in text.splitlines() if line.strip()]
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e})") from None
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{path}:{number}: expected an object with a non-empty string \"prompt\", got "
                             f"{line.strip()[:80]}")
        prompts.append(prompt)
    return prompts


def _model_args(p) -> None:
    p.add_argument("--model", required=True, help="checkpoint folder (config.json, safetensors, tokenizer files)")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16 or auto")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--decoder-window", choices=["reference", "symmetric"], default="reference",
                   help="semantics switch: sliding layers of a denoising pass see the reference's last W-1 cached "
                        "tokens (default), or |q - k| <= W-1 like flash-attention / vLLM (spec C.10, E)")


def add_accuracy_commands(subparsers) -> None:
    """Register `trace`, `compare` and `golden`."""
    p = subparsers.add_parser("trace", help="record a generation trace (every canvas and step) to a folder",
                              description="Generate with return_trace=True and save manifest.json + "
                                          "trace.safetensors (docs/trace-format.md).")
    _model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--prompts", help="a file with one prompt per line (a batch, left-padded)")
    p.add_argument("--out", required=True, help="output folder (refused if it holds a trace, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace a trace already in --out")
    p.add_argument("--seed", type=seed_arg, default=0, help="random seed (default 0)")
    p.add_argument("--top-k", type=_positive_int, default=8, help="top-k tokens kept per position (default 8)")
    p.add_argument("--sc-embedding", action="store_true",
                   help="also keep the exact self-conditioning input [B, L, H] per step (4*H bytes a position), so "
                        "the replay needs no top-k approximation")
    p.add_argument("--max-new-tokens", type=_positive_int, default=None, help="new tokens (whole canvases)")
    p.add_argument("--steps", type=steps_arg, default=None, help="max denoising steps per canvas")
    p.add_argument("--sampling", choices=["reference", "fast", "gumbel"], default="reference",
                   help="reference (default), fast (lock-step, per-row seeds) or gumbel (semantics switch: reference "
                        "with vLLM's Gumbel-max draw)")
    p.add_argument("--batching", choices=["lockstep", "mixed"], default="lockstep",
                   help="lockstep (default: one record per step of the batch) or mixed (--sampling fast only: every "
                        "row on its own schedule, one record per row and step; docs/trace-format.md)")
    p.set_defaults(func=run_trace)

    p = subparsers.add_parser("compare", help="replay a trace teacher-forced through the model; exit 0 within the "
                                              "thresholds, 1 not, 2 on a malformed trace",
                              description="At every recorded step, feed the trace's prefix, canvas and "
                                          "self-conditioning state to our decoder and compare distributions.")
    _model_args(p)
    p.add_argument("--trace", default=None, help="trace folder (manifest.json + trace.safetensors); or --engine-url")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--min-top1", type=_fraction, default=None,
                   help="least top-1 agreement per step (default 0.99; minimal traces: none)")
    p.add_argument("--max-kl", type=_non_negative, default=None, help="largest mean KL per step (default 0.01)")
    p.add_argument("--temperature-tol", type=_non_negative, default=None,
                   help="check `temperature`: largest |recorded - scheduled| temperature (default 1e-3)")
    p.add_argument("--sc-tol", type=_non_negative, default=None,
                   help="check `self_conditioning`: largest |recorded input log-prob - previous step's| (default 2e-2)")
    p.add_argument("--sc-embedding-tol", type=_non_negative, default=None,
                   help="check `self_conditioning`: largest |sc_embedding| where no input is due (default 0: exact)")
    p.add_argument("--near-tie", type=_non_negative, default=None,
                   help="checks `acceptance`, `stop`: relative slack around the entropy bound / confidence threshold "
                        "within which either decision passes (default 1e-3)")
    p.add_argument("--renoise-sigmas", type=_non_negative, default=None,
                   help="check `renoise`: binomial z-score of non-accepted positions holding the argmax (default 6)")
    p.add_argument("--route-sigmas", type=_non_negative, default=None,
                   help="check `acceptance`, discrete DDIM: binomial z-score of the clean-route count (default 6)")
    from .engine_compare import add_engine_arguments

    add_engine_arguments(p)
    p.set_defaults(func=run_compare)

    p = subparsers.add_parser("kl", help="KL divergence of a checkpoint from its base on the base's own trajectories; "
                                         "exit 0, 1 past a --max-*/--min-* threshold, 2 on bad input",
                              description="The base generates; both models replay its steps teacher-forced; their "
                                          "distributions are compared at every denoising position.")
    p.add_argument("--base", required=True, help="the base checkpoint folder (it generates)")
    p.add_argument("--model", required=True, help="the checkpoint to judge (quantized, ported, ...)")
    p.add_argument("--prompts", required=True, help="prompts file (one per line, or .jsonl with a \"prompt\" field)")
    p.add_argument("--samples", type=_positive_int, default=1, help="generations per prompt, seeds 0.. (default 1)")
    p.add_argument("--max-tokens", type=_positive_int, default=None, help="new tokens per generation (whole canvases)")
    p.add_argument("--steps", type=steps_arg, default=None, help="max denoising steps per canvas")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--max-kl-mean", type=_non_negative, default=None, help="exit 1 when kl_mean exceeds this")
    p.add_argument("--max-kl-99", type=_non_negative, default=None, help="exit 1 when the 99th KL percentile exceeds")
    p.add_argument("--min-top1", type=_fraction, default=None, help="exit 1 when top1_agreement is below this")
    p.add_argument("--max-dp-rms", type=_non_negative, default=None, help="exit 1 when dp_rms exceeds this")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16 or auto")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--quantization", choices=["bnb-4bit", "bnb-8bit"], default=None,
                   help="quantize --model on load with bitsandbytes (4-bit NF4 or LLM.int8; serve's names), to judge "
                        "what bitsandbytes does to a bf16/fp32 checkpoint; --base loads as it is")
    p.set_defaults(func=run_kl)

    p = subparsers.add_parser("golden", help="write golden outputs for another engine's CI, or --check them",
                              description="Reference-mode tokens, text, steps per canvas, tokens per forward and "
                                          "a first-step top-k fingerprint per prompt, one JSON line each.")
    _model_args(p)
    p.add_argument("--prompts", help="prompts file (one per line); required without --check")
    p.add_argument("--out", help="golden file to write (.jsonl); required without --check; refused if it exists, "
                                 "unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--check", help="golden file to re-run and compare (exit 0 when identical, 1 otherwise)")
    p.add_argument("--seed", type=seed_arg, default=None,
                   help="seed (default 0 when writing; the file's when checking)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=None, help="new tokens (whole canvases)")
    p.add_argument("--steps", type=steps_arg, default=None, help="max denoising steps per canvas")
    p.set_defaults(func=run_golden)


def _refuse_existing(path: Path, what: str) -> None:
    """Say why an existing output is not replaced."""
    print(f"error: {path} holds {what} already: pass --overwrite to replace it, or choose another --out",
          file=sys.stderr)


def run_trace(args) -> int:
    import torch

    from .format import MANIFEST, TENSORS

    out_dir = Path(args.out)
    if args.batching == "mixed" and args.sampling != "fast":
        print(f"error: --batching mixed needs --sampling fast (--sampling {args.sampling} draws from the global RNG "
              "in the built-in's order over one lock-step batch)", file=sys.stderr)
        return 2
    if out_dir.exists() and not out_dir.is_dir():
        print(f"error: --out {out_dir} is a file, not a folder", file=sys.stderr)
        return 2
    if not args.overwrite and ((out_dir / MANIFEST).exists() or (out_dir / TENSORS).exists()):
        _refuse_existing(out_dir, "a trace")
        return 2
    model, tokenizer = _load(args)
    prompts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
    if not prompts:
        print(f"error: {args.prompts} holds no prompts", file=sys.stderr)
        return 2
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    overrides = {k: v for k, v in (("max_new_tokens", args.max_new_tokens), ("max_denoising_steps", args.steps))
                 if v is not None}
    if args.sampling == "fast":
        overrides.update(sampling="fast", seed=args.seed, batching=args.batching)
    else:
        torch.manual_seed(args.seed)
    out = model.generate(enc["input_ids"].to(args.device), attention_mask=enc["attention_mask"].to(args.device),
                         return_trace=True, trace_top_k=args.top_k, trace_sc_embedding=args.sc_embedding,
                         **overrides)
    trace = out.trace
    trace.manifest["prompts"] = prompts
    trace.manifest["seed_argument"] = args.seed
    trace.save(args.out, overwrite=args.overwrite)  # atomic: an interruption leaves the old trace whole
    records = trace.tensors["canvas_index"].shape[0]
    print(f"wrote {args.out}: {trace.num_canvases} canvas(es), {records} step record(s), batch {len(prompts)}")
    return 0


def run_compare(args) -> int:
    if args.engine_url is not None:
        from .engine_compare import run_engine_compare

        return run_engine_compare(args, _load)
    if args.trace is None:
        print("error: compare needs --trace DIR (a recorded trace) or --engine-url URL (a running server)",
              file=sys.stderr)
        return 2
    from .format import TraceFormatError, load_trace
    from .replay import replay
    from .report import DEFAULT_MAX_KL, DEFAULT_MIN_TOP1, format_table, summarize

    try:
        trace = load_trace(args.trace)
    except TraceFormatError as e:
        print(f"error: malformed trace: {e}", file=sys.stderr)
        return 2
    model, _ = _load(args)
    if trace.manifest.get("logits_processors"):
        print(f"warning: the trace was made with logits processors {trace.manifest['logits_processors']}, which "
              "the replay does not apply: expect differences where they changed the logits", file=sys.stderr)
    recorded_window = trace.manifest.get("decoder_window")
    if recorded_window is not None and recorded_window != args.decoder_window:
        print(f"warning: the trace was recorded with decoder_window {recorded_window!r}, the replay uses "
              f"{args.decoder_window!r} (--decoder-window)", file=sys.stderr)
    try:
        scores = replay(model, trace)
    except TraceFormatError as e:
        print(f"error: malformed trace: {e}", file=sys.stderr)
        return 2
    if trace.is_minimal:
        min_top1, max_kl = args.min_top1, None
    else:
        min_top1 = DEFAULT_MIN_TOP1 if args.min_top1 is None else args.min_top1
        max_kl = DEFAULT_MAX_KL if args.max_kl is None else args.max_kl
    try:
        verdicts = trace_checks(trace, model, args)
    except TraceFormatError as e:
        print(f"error: malformed trace: {e}", file=sys.stderr)
        return 2
    summary = summarize(scores, trace.is_minimal, min_top1, max_kl, verdicts)
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return 0 if summary["passed"] else 1


def trace_checks(trace, model, args) -> dict:
    """The algorithm checks (accuracy/checks.py) with the recorded sampler and stopper and the flags' tolerances."""
    from .checks import Tolerances, recorded_sampler_config, run_checks
    from .replay import replay_stopper

    settings = trace.manifest.get("generation_config") or {}
    recorded_stop = settings.get("stopper_config") is not None or (
        settings.get("stability_threshold") is not None and settings.get("confidence_threshold") is not None)
    stopper = replay_stopper(trace, model) if recorded_stop else None
    tol = Tolerances(**{k: v for k, v in (("temperature", args.temperature_tol), ("sc_logprob", args.sc_tol),
                                          ("sc_embedding", args.sc_embedding_tol), ("near_tie", args.near_tie),
                                          ("renoise_sigmas", args.renoise_sigmas),
                                          ("route_sigmas", args.route_sigmas)) if v is not None})
    return run_checks(trace, recorded_sampler_config(trace.manifest), stopper, tol)


def bnb_config(name: str | None, dtype):
    """`--quantization` -> a `BitsAndBytesConfig` (None: load as saved). 4-bit is NF4 computing in `dtype` (the
    checkpoint's dtype when `dtype` is "auto")."""
    if name is None:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if name == "bnb-8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = dtype if isinstance(dtype, torch.dtype) else None
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)


def run_kl(args) -> int:
    """`diffusiongemma kl` (accuracy/kl.py)."""
    import torch
    from transformers import AutoTokenizer

    from ..cli_types import dtype_arg
    from ..model import DiffusionGemmaForBlockDiffusion
    from .kl import format_kl, positions_of, summarize_kl

    try:
        prompts = read_prompts(args.prompts)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: --prompts {args.prompts}: {e}", file=sys.stderr)
        return 2
    if not prompts:
        print(f"error: --prompts {args.prompts} holds no prompts", file=sys.stderr)
        return 2
    models = []
    for flag, path in (("--base", args.base), ("--model", args.model)):
        try:
            quantization = bnb_config(args.quantization, dtype_arg(args.dtype)) if flag == "--model" else None
            if quantization is None:
                model = DiffusionGemmaForBlockDiffusion.from_pretrained(path, dtype=dtype_arg(args.dtype))
                model = model.to(args.device)
            else:  # bitsandbytes places the quantized weights itself
                model = DiffusionGemmaForBlockDiffusion.from_pretrained(
                    path, dtype=dtype_arg(args.dtype), quantization_config=quantization, device_map=args.device)
            models.append(model.eval())
        except (OSError, ValueError, ImportError) as e:
            print(f"error: {flag} {path}: {e}", file=sys.stderr)
            return 2
    base, other = models
    for what, a, b in (("vocab_size", base.config.text_config.vocab_size, other.config.text_config.vocab_size),
                       ("canvas_length", base.canvas_length, other.canvas_length),
                       ("hidden_size", base.config.text_config.hidden_size, other.config.text_config.hidden_size)):
        if a != b:
            print(f"error: --base has {what} {a}, --model {b}: not the same architecture", file=sys.stderr)
            return 2
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    overrides = {k: v for k, v in (("max_new_tokens", args.max_tokens), ("max_denoising_steps", args.steps))
                 if v is not None}
    parts = []
    for sample in range(args.samples):
        torch.manual_seed(sample)
        trace = base.generate(enc["input_ids"].to(args.device), attention_mask=enc["attention_mask"].to(args.device),
                              return_trace=True, trace_top_k=1, trace_sc_embedding=True, **overrides).trace
        parts.append(positions_of(base, other, trace))
    try:
        report = summarize_kl(parts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    limits = {"max_kl_mean": (args.max_kl_mean, report["kl_mean"], "above"),
              "max_kl_99": (args.max_kl_99, report["kl_quantiles"]["99"], "above"),
              "min_top1": (args.min_top1, report["top1_agreement"], "below"),
              "max_dp_rms": (args.max_dp_rms, report["dp_rms"], "above")}
    failed = [name for name, (limit, value, side) in limits.items() if limit is not None and value is not None
              and (value > limit if side == "above" else value < limit)]
    report["failed_thresholds"] = failed
    report["passed"] = not failed
    print(json.dumps(report, indent=2) if args.json else format_kl(report) + "\n"
          + ("PASS" if not failed else f"FAIL: {', '.join(failed)}"))
    return 0 if not failed else 1


def run_golden(args) -> int:
    from .golden import check_golden, write_golden

    if args.check is None and (args.prompts is None or args.out is None):
        print("error: golden needs --prompts and --out to write, or --check FILE", file=sys.stderr)
        return 2
    if args.check is None and Path(args.out).exists() and not args.overwrite:
        _refuse_existing(Path(args.out), "a file")
        return 2
    model, tokenizer = _load(args)
    if args.check is not None:
        try:
            problems = check_golden(model, tokenizer, args.check, seed=args.seed)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for index, diff in problems:
            print(f"record {index}: first divergence at {diff}")
        print("golden check: " + ("PASS" if not problems else f"FAIL ({len(problems)} record(s) differ)"))
        return 0 if not problems else 1
    records = write_golden(model, tokenizer, read_prompts(args.prompts), args.out,
                           seed=0 if args.seed is None else args.seed, max_new_tokens=args.max_new_tokens,
                           steps=args.steps)
    print(f"wrote {args.out}: {len(records)} record(s)")
    return 0

