"""The `diffusiongemma` command line.

    diffusiongemma generate --model PATH "prompt"      generate text with a checkpoint folder
        [--sampler NAME --sampler-setting K=V ...]       ... with another sampler (docs/samplers.md)
        [--image FILE ...]                               ... about images (docs/vision.md)
        [--regex P | --json-schema FILE]                 ... that matches a constraint (docs/constraints.md)
    diffusiongemma sudoku [--puzzle P | --puzzles F | --eval N] [--json]
    diffusiongemma train sudoku --out DIR
    diffusiongemma train sft --model PATH --data FILE.jsonl --out DIR [--lora]   fine-tune (docs/training.md)
    diffusiongemma quantize --scheme fp8-dynamic|nvfp4 SRC DST
    diffusiongemma trace | compare | golden             reference accuracy (docs/reference-accuracy.md)
    diffusiongemma eval --model PATH --tasks NAMES      lm-evaluation-harness tasks (docs/evaluation.md)

Each command lives in its own `add_*_command(subparsers)` function; `main` wires them together.
"""

import argparse
import os
import sys

from .cli_types import dtype_arg, positive_int, seed_arg, steps_arg  # noqa: F401 - positive_int: this module's API
from .io.tokenizer_files import TOKENIZER_FILES, folder_has_tokenizer


_dtype = dtype_arg  # the name the commands below use


def has_tokenizer_files(path: str) -> bool:
    """Whether `path` can give a tokenizer: a local folder holding tokenizer files, or a Hub id (checked on loading).

    A local model folder without them must not load: transformers would quietly build a default tokenizer for the
    model type, whose ids mean nothing to this checkpoint.
    """
    return not os.path.isdir(path) or folder_has_tokenizer(path)


def add_generate_command(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text from a prompt with a DiffusionGemma checkpoint folder",
        description="Generate text by block diffusion. The tokenizer is read from the model folder, or from "
        "--tokenizer when that folder has none. The generated text goes to stdout; progress to stderr.",
    )
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json, safetensors, tokenizer files)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer folder or Hub id, for a --model folder that has no tokenizer files")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="new tokens to generate (rounded up to whole canvases); default: the checkpoint's setting")
    p.add_argument("--steps", type=steps_arg, default=None,
                   help="maximum denoising steps per canvas (max_denoising_steps); default: the checkpoint's")
    p.add_argument("--seed", type=seed_arg, default=0, help="random seed (default 0)")
    p.add_argument("--sampling", choices=["reference", "fast"], default="reference",
                   help="reference: the built-in implementation's tokens (default); fast: the same distribution, "
                        "several times faster, its own random stream")
    p.add_argument("--sampler", default=None, metavar="NAME",
                   help="entropy-bound, block-refinement, confidence-threshold, discrete-ddim (or a registered "
                        "sampler config's class name); default: the checkpoint's (docs/samplers.md)")
    p.add_argument("--sampler-preset", default=None, metavar="NAME",
                   help="a named preset, the measured best setting of one sampler: entropy-bound, block-refinement, "
                        "confidence-threshold or discrete-ddim (docs/samplers.md); --sampler-setting adjusts it")
    p.add_argument("--sampler-setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the sampler, e.g. threshold=0.9 or corrector_steps=2 (repeat for several; "
                        "the value is read as JSON: true, 0.5, null, or else a plain string)")
    p.add_argument("--compile", action="store_true",
                   help="run each denoising step as one compiled fixed-shape graph per batch bucket (generate(compile=True); "
                        "the first call pays the compilation)")
    p.add_argument("--dtype", type=_dtype, default="auto", help="float32, bfloat16, float16 or auto (default)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the chat template")
    p.add_argument("--show-drafts", action="store_true",
                   help="redraw the canvas in the terminal at every denoising step to watch it converge (when "
                        "stdout is not a terminal: one plain line per draft on stderr)")
    p.add_argument("--no-color", action="store_true",
                   help="no ANSI colours or cursor codes, as when the output is not a terminal (also: NO_COLOR=1)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--image", action="append", default=[], metavar="FILE",
                   help="an image the prompt is about (repeat for several, in order); read with Pillow. The prompt's "
                        "image tokens mark where each goes; without any, the images come first (docs/vision.md)")
    p.add_argument("--allow-network", action="store_true", help="let --image take http(s) URLs and download them")
    constrain = p.add_mutually_exclusive_group()
    constrain.add_argument("--regex", default=None, metavar="P",
                           help="the answer fully matches regular expression P (docs/constraints.md)")
    constrain.add_argument("--json-schema", default=None, metavar="FILE",
                           help="the answer is JSON valid under the JSON schema in FILE (docs/constraints.md)")
    p.set_defaults(func=run_generate)


def constraint_from_args(args):
    """The `Regex` / `JsonSchema` of --regex / --json-schema, or None. A schema file that cannot be read or is not
    JSON is an error naming the file."""
    from .constraints import JsonSchema, Regex

    if getattr(args, "regex", None) is not None:
        return Regex(args.regex)
    if getattr(args, "json_schema", None) is None:
        return None
    import json

    try:
        with open(args.json_schema, encoding="utf-8") as f:
            schema = json.load(f)
    except OSError as error:
        raise ValueError(f"--json-schema {args.json_schema}: cannot read it ({error.strerror})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"--json-schema {args.json_schema}: not JSON (line {error.lineno}: {error.msg})") from None
    return JsonSchema(schema)


def run_generate(args) -> int:
    import torch
    from transformers import AutoTokenizer

    from .generation.streamers import CanvasPrinter, is_terminal
    from .model import DiffusionGemmaForBlockDiffusion
    from .modeling.config import check_model_folder
    from .processing import image_prompt_inputs, load_image, load_processor

    check_model_folder(args.model)  # first: "not a DiffusionGemma folder" says more than "no tokenizer"
    constraint = constraint_from_args(args)  # a bad regex or schema fails before the model loads
    tokenizer_path = args.tokenizer or args.model
    if not has_tokenizer_files(tokenizer_path):
        where = "--tokenizer" if args.tokenizer else "--model"
        print(f"error: {where} {tokenizer_path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); pass "
              "--tokenizer with the folder or Hub id of the checkpoint's tokenizer", file=sys.stderr)
        return 2
    images = [load_image(source, args.allow_network) for source in args.image]  # before the model: fail fast
    try:  # before the model too: a bad sampler setting needs no weights to be refused
        sampler_config = sampler_from_args(args.sampler, args.sampler_setting, args.model, args.sampler_preset)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.model, dtype=args.dtype).to(args.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    vision = {}
    if images:  # the processor turns the images into pixels and the prompt's placeholders
        vision = image_prompt_inputs(load_processor(tokenizer_path), args.prompt, images, args.chat)
        vision = {k: v.to(args.device) for k, v in vision.items() if k != "attention_mask"}
        ids = vision.pop("input_ids")
    elif args.chat:
        if not getattr(tokenizer, "chat_template", None):
            print(f"error: --chat needs a chat template, and the tokenizer in {tokenizer_path} has none",
                  file=sys.stderr)
            return 2
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt",
            return_dict=True,
        )["input_ids"]
    else:
        ids = tokenizer(args.prompt, return_tensors="pt")["input_ids"]
    ids = ids.to(args.device)
    overrides = dict(vision)
    if args.max_new_tokens is not None:
        overrides["max_new_tokens"] = args.max_new_tokens
    if args.steps is not None:
        overrides["max_denoising_steps"] = args.steps
    max_new = args.max_new_tokens or model.generation_config.max_new_tokens or 256
    canvases = -(-max_new // model.canvas_length)
    color = not args.no_color and not os.environ.get("NO_COLOR")  # https://no-color.org
    printer = CanvasPrinter(
        tokenizer, show_drafts=args.show_drafts, progress=not args.quiet, total_canvases=canvases,
        ansi=color and is_terminal(sys.stdout), skip_special_tokens=True,
    )
    progress = _ProgressLine(canvases, model.canvas_length, enabled=not args.quiet and not args.show_drafts,
                             ansi=color and is_terminal(sys.stderr))
    if args.compile:
        overrides["compile"] = True
    if sampler_config is not None:
        overrides["sampler_config"] = sampler_config
    if args.sampling == "fast":
        overrides.update(sampling="fast", seed=args.seed)
    else:  # named: a sampler whose default is per-row ("fast") still runs reference here, as the flag says
        overrides["sampling"] = "reference"
        torch.manual_seed(args.seed)
    if constraint is not None:
        overrides.update(constraint=constraint, tokenizer=tokenizer)
    out = model.generate(ids, streamer=_Tee(printer, progress), **overrides)
    if not args.quiet:
        tpf = out.tokens_per_forward.tolist() if hasattr(out, "tokens_per_forward") else []
        print(f"[{canvases} canvas(es) max, tokens per forward: {', '.join(f'{t:.2f}' for t in tpf)}]",
              file=sys.stderr)
    if getattr(out, "truncated", None) is not None and bool(out.truncated.any()):
        why = next(r for r in out.truncation_reasons if r is not None)
        print(f"error: {why}: the text above is not a whole answer", file=sys.stderr)
        return 3
    return 0


def sampler_from_args(name: str | None, settings: list[str], model_path: str, preset: str | None = None):
    """--sampler NAME (or --sampler-preset NAME) and --sampler-setting KEY=VALUE -> a sampler config, or None (the
    checkpoint's as it is).

    Settings without --sampler apply to the checkpoint's own sampler config (generation_config.json), with
    --sampler-preset to the preset.

    Raises:
        ValueError: naming the flag and the setting.
    """
    import json

    from .generation.sampler_presets import sampler_preset
    from .generation.sampler_settings import SamplerSettingError, sampler_config_class_named, sampler_config_from

    if preset is not None and name is not None:
        raise ValueError("--sampler-preset names its own sampler: give it or --sampler, not both")
    if name is None and not settings and preset is None:
        return None
    pairs = {}
    for item in settings:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--sampler-setting must look like KEY=VALUE, got {item!r}")
        try:
            pairs[key] = json.loads(raw)
        except json.JSONDecodeError:
            pairs[key] = raw
    base = None
    if preset is not None:
        try:
            base = sampler_preset(preset, "--sampler-preset")
        except SamplerSettingError as error:
            raise ValueError(f"--sampler-preset: {error}") from None
    elif name is None:
        from .generation_config import DiffusionGemmaGenerationConfig

        try:
            base = DiffusionGemmaGenerationConfig.from_pretrained(model_path).sampler_config
        except OSError:  # no generation_config.json: the built-in default
            base = None
        if base is None:
            name = "entropy-bound"
    try:
        config_class = sampler_config_class_named(name) if name is not None else type(base)
        return sampler_config_from(config_class, pairs, base)
    except SamplerSettingError as error:
        flag = "--sampler" if error.field == "sampler" and name is not None and not pairs else "--sampler-setting"
        raise ValueError(f"{flag} {error.field}: {error}") from None


class _ProgressLine:
    """Progress on stderr: "[canvas k/n, step s, tokens/forward t]".

    On a terminal (`ansi`) the line is rewritten in place at every step and erased at the end. Otherwise (a file, a
    pipe, --no-color) one plain line is written per committed canvas: "[canvas k/n done, s steps, tokens/forward t]".
    tokens/forward is the committed tokens per denoising pass so far (canvas length x canvases / passes).
    """

    def __init__(self, total: int, canvas_length: int, enabled: bool, ansi: bool = True):
        self.total, self.canvas_length, self.enabled, self.ansi = total, canvas_length, enabled, ansi
        self.canvas, self.step, self.passes = 0, 0, 0

    def _rate(self) -> str:
        return f", tokens/forward {self.canvas * self.canvas_length / self.passes:.2f}" if self.passes else ""

    def put_draft(self, value=None, logits=None):
        self.step += 1
        if self.enabled and self.ansi:
            print(f"\r\x1b[K[canvas {self.canvas + 1}/{self.total}, step {self.step}{self._rate()}]", end="",
                  file=sys.stderr, flush=True)

    def put(self, value):
        if self.step:  # a committed canvas (the first put is the prompt)
            self.canvas += 1
            self.passes += self.step
            if self.enabled and not self.ansi:
                print(f"[canvas {self.canvas}/{self.total} done, {self.step} steps{self._rate()}]", file=sys.stderr,
                      flush=True)
            self.step = 0

    def end(self):
        if self.enabled and self.ansi:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)


class _Tee:
    """Fan one generate stream out to several streamers."""

    def __init__(self, *streamers):
        self.streamers = streamers

    def put(self, value):
        for s in self.streamers:
            s.put(value)

    def put_draft(self, value=None, logits=None):
        for s in self.streamers:
            s.put_draft(value=value, logits=logits)

    def end(self):
        for s in self.streamers:
            s.end()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffusiongemma",
        description="DiffusionGemma block-diffusion language model: generate text, solve Sudoku with the bundled "
        "demo model, train it, and quantize checkpoints. Run `diffusiongemma COMMAND --help` for details.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_generate_command(subparsers)
    from .accuracy.cli import add_accuracy_commands
    from .conversion.cli import add_convert_commands
    from .evaluation.cli import add_eval_command
    from .quantization.cli import add_quantize_command
    from .serving.cli import add_serve_commands
    from .sudoku.cli import add_sudoku_commands
    from .training.cli import add_sft_command

    add_sft_command(add_sudoku_commands(subparsers))  # `train sudoku`, then `train sft` beside it
    add_quantize_command(subparsers)
    add_accuracy_commands(subparsers)
    add_serve_commands(subparsers)
    add_convert_commands(subparsers)
    add_eval_command(subparsers)
    return parser


TRACEBACK_ENV = "DIFFUSIONGEMMA_TRACEBACK"


def one_line_error(error: BaseException) -> str:
    """`error: <message>` on one line; the exception's type is named unless it is a plain, self-explaining one."""
    message = " ".join(str(error).split()) or "(no message)"
    if isinstance(error, FileNotFoundError) and error.filename and str(error.filename) not in message:
        message = f"{message}: {error.filename}"
    plain = (ValueError, TypeError, OSError, RuntimeError, ImportError)
    return f"error: {message}" if type(error) in plain or type(error).__module__.startswith("diffusiongemma") \
        or isinstance(error, OSError) else f"error: {type(error).__name__}: {message}"


def run_command(func, args) -> int:
    """Run a subcommand: a run-time error prints one clear line on stderr and returns 1 (Ctrl-C: 130) instead of a
    traceback; set DIFFUSIONGEMMA_TRACEBACK=1 to see the traceback."""
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        return func(args)
    try:
        return func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - every run-time error becomes one line
        print(one_line_error(error), file=sys.stderr)
        print(f"(set {TRACEBACK_ENV}=1 for the traceback)", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
