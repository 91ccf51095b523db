"""`diffusiongemma eval`: lm-evaluation-harness tasks on a checkpoint, through the "diffusiongemma" lm-eval model.

    diffusiongemma eval --model PATH --tasks NAMES [--include-path DIR] [--limit N] [--output FILE.json] [...]

Prints lm-eval's results table, then the diffusion-specific figures (mean denoising passes per generated answer,
the ELBO's Monte Carlo samples and mean standard error); writes lm-eval's results JSON with those figures added under
"diffusiongemma". Progress bars go to stderr. See docs/evaluation.md.
"""

import argparse
import json
import sys
from pathlib import Path

from ..cli_types import positive_int, seed_arg, steps_arg


def _limit(text: str) -> float | int:
    """--limit: a count of documents (an integer >= 1) or a fraction of them (0 < x < 1), as lm-eval takes it."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count (>= 1) or a fraction (0 < x < 1), got {text!r}") from None
    if value >= 1 and value.is_integer():
        return int(value)
    if 0 < value < 1:
        return value
    raise argparse.ArgumentTypeError(f"expected a count (>= 1) or a fraction (0 < x < 1), got {text!r}")


def add_eval_command(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="score a checkpoint on lm-evaluation-harness tasks (needs the `eval` extra)",
        description="Run lm-evaluation-harness tasks on a DiffusionGemma checkpoint: generation tasks with our "
        "generate, log-likelihood tasks with the block-diffusion ELBO estimate (docs/evaluation.md).",
    )
    p.add_argument("--model", required=True, help="checkpoint folder (dense, quantized or bitsandbytes)")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task or group names")
    p.add_argument("--include-path", metavar="DIR", help="a folder of task YAML files (custom tasks)")
    p.add_argument("--limit", type=_limit, help="documents per task: a count, or a fraction below 1")
    p.add_argument("--output", metavar="FILE.json", help="write lm-eval's results JSON here")
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples per prompt (default: the task's)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts per generate call (default 8)")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--device-map", default=None, help="accelerate device map, e.g. auto (instead of --device)")
    p.add_argument("--peft", default=None, metavar="DIR", help="a PEFT adapter folder, merged into the model")
    p.add_argument("--steps", type=steps_arg, default=None, help="max denoising steps per canvas")
    p.add_argument("--sampler-preset", default=None, metavar="NAME", help="a named sampler preset (docs/samplers.md)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seeds generation and the ELBO draws (default 0)")
    p.add_argument("--mc-samples", type=positive_int, default=None,
                   help="Monte Carlo samples per log-likelihood request (default 32)")
    p.add_argument("--apply-chat-template", action="store_true", help="wrap prompts in the tokenizer's chat template")
    p.add_argument("--log-samples", action="store_true", help="keep every document's answers in the JSON")
    p.set_defaults(func=run_eval)


def model_args(args) -> dict:
    """The `DiffusionGemmaLM` keyword arguments of the command's flags."""
    kwargs = {"pretrained": args.model, "dtype": args.dtype, "batch_size": args.batch_size, "seed": args.seed,
              "device": args.device, "device_map": args.device_map, "peft": args.peft,
              "max_denoising_steps": args.steps, "sampler_preset": args.sampler_preset}
    if args.mc_samples is not None:
        kwargs["mc_samples"] = args.mc_samples
    return {k: v for k, v in kwargs.items() if v is not None}


def diffusion_summary(lm) -> dict:
    """What lm-eval's table does not show: passes per generated answer, the ELBO's samples and standard errors."""
    passes, errors = lm.generation_passes, lm.elbo_standard_errors
    return {
        "generated_answers": len(passes),
        "mean_denoising_passes": sum(passes) / len(passes) if passes else None,
        "loglikelihood_requests": len(errors),
        "mc_samples": lm.mc_samples,
        "mean_standard_error": sum(errors) / len(errors) if errors else None,
    }


def task_manager(tasks: list[str], include_path: str | None):
    """lm-eval's `TaskManager`: over --include-path alone when it holds every task (indexing lm-eval's own ~15 000
    task files takes about a minute), else over both."""
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        own = TaskManager(include_path=include_path, include_defaults=False)
        if all(t in own.all_tasks for t in tasks):
            return own
    return TaskManager(include_path=include_path)


def run_eval(args) -> int:
    from . import NEEDS_LM_EVAL

    try:
        import lm_eval
    except ImportError:
        raise ImportError(NEEDS_LM_EVAL) from None
    from lm_eval.utils import handle_non_serializable, make_table

    from .adapter import DiffusionGemmaLM

    if args.include_path is not None and not Path(args.include_path).is_dir():
        raise ValueError(f"--include-path {args.include_path}: not a folder")
    if args.output is not None and Path(args.output).is_dir():
        raise ValueError(f"--output {args.output}: is a folder; give a file name such as results.json")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    manager = task_manager(tasks, args.include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        where = f" (nor in --include-path {args.include_path})" if args.include_path else ""
        raise ValueError(f"--tasks: unknown task(s) {unknown}: not among lm-eval's tasks{where}")
    lm = DiffusionGemmaLM(**model_args(args))
    results = lm_eval.simple_evaluate(
        model=lm, tasks=tasks, task_manager=manager, limit=args.limit, num_fewshot=args.num_fewshot,
        apply_chat_template=args.apply_chat_template, log_samples=args.log_samples,
    )
    summary = diffusion_summary(lm)
    results["diffusiongemma"] = summary
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    if summary["mean_denoising_passes"] is not None:
        print(f"generation: {summary['generated_answers']} answers, {summary['mean_denoising_passes']:.2f} mean "
              "denoising passes per answer")
    if summary["mean_standard_error"] is not None:
        print(f"log-likelihood (ELBO): {summary['loglikelihood_requests']} requests, {summary['mc_samples']} samples "
              f"each, mean standard error {summary['mean_standard_error']:.3f} nats")
    if args.output is not None:
        Path(args.output).write_text(json.dumps(results, indent=2, default=handle_non_serializable))
        print(f"results written to {args.output}", file=sys.stderr)
    return 0
