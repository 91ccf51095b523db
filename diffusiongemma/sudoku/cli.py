"""Command-line entry points of the Sudoku demo, plugged into `diffusiongemma` by `add_sudoku_commands`.

    diffusiongemma sudoku                      solve a fresh random puzzle, animating each denoising step
    diffusiongemma sudoku --puzzle '53..7....'  solve one given puzzle (81 cells, '.' or '0' for blanks)
    diffusiongemma sudoku --puzzles FILE       solve each puzzle of a file (one per line)
    diffusiongemma sudoku --eval N             solve rate and mean steps on N fresh puzzles
    diffusiongemma train sudoku --out DIR      train a Sudoku model (see sudoku/train.py)
"""

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from ..cli_types import positive_int, seed_arg, steps_arg
from ..generation.streamers import is_terminal
from .puzzles import BLANK, check_puzzle, read_puzzles
from .render import render_grid

# Fewest givens at which the bundled demo model solves most puzzles: 94 % of 50 fresh 36-given puzzles in 6.4 mean
# steps (`diffusiongemma sudoku --eval 50 --givens 36 --seed 3 --json`; at 30 givens about 55 %); harder: --givens.
DEFAULT_GIVENS = 36


def _givens(text: str) -> int:
    value = int(text)
    if not 17 <= value <= 81:
        raise argparse.ArgumentTypeError(f"givens must be in 17..81, got {value}")
    return value


def _givens_list(text: str) -> list[int]:
    return [_givens(part) for part in text.split(",") if part.strip()]


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def add_sudoku_commands(subparsers):
    """Register `sudoku` and `train sudoku` on the main parser's subparsers; returns the `train` command's recipe
    subparsers, for other recipes (`train sft`)."""
    p = subparsers.add_parser(
        "sudoku",
        help="solve Sudoku with the bundled DiffusionGemma demo model",
        description="Solve Sudoku puzzles by block diffusion: the model denoises the 81 cells of the solution "
        "in parallel, a few cells per step. Without arguments it solves a fresh random puzzle and redraws the grid "
        "after every denoising step.",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--puzzle", help="one puzzle: 81 characters, digits and '.' or '0' for blanks")
    source.add_argument("--puzzles", metavar="FILE", help="a file with one puzzle per line")
    source.add_argument("--eval", type=positive_int, metavar="N", help="report solve rate and mean steps on N "
                        "fresh puzzles")
    p.add_argument("--givens", type=_givens, default=DEFAULT_GIVENS,
                   help=f"filled cells of generated puzzles, 17..81; fewer is harder (default {DEFAULT_GIVENS}, "
                   "where the bundled demo model solves most puzzles)")
    p.add_argument("--seed", type=seed_arg, default=None, help="seed puzzle generation and denoising")
    p.add_argument("--model", default=None, help="model folder (default: the bundled demo model)")
    p.add_argument("--max-steps", type=steps_arg, default=None, help="max denoising steps (default: the model's)")
    p.add_argument("--no-animation", action="store_true", help="do not redraw the grid at every step")
    p.add_argument("--no-color", action="store_true",
                   help="no ANSI colours or cursor codes, as when stdout is not a terminal (also: NO_COLOR=1); "
                   "the steps then print as plain lines")
    p.add_argument("--json", action="store_true", help="print JSON: one line per puzzle, or one for --eval")
    p.set_defaults(func=run_sudoku)

    train = subparsers.add_parser("train", help="train a small DiffusionGemma", description="Training recipes.")
    recipes = train.add_subparsers(dest="recipe", metavar="RECIPE", required=True)
    t = recipes.add_parser(
        "sudoku",
        help="train a Sudoku solver on generated puzzles (CPU is fine)",
        description="Train a tiny DiffusionGemma on generated puzzles with the block-diffusion loss; evaluates the "
        "solve rate on held-out puzzles every --eval-every steps and writes a resumable checkpoint. With --resume "
        "the run's saved settings are reused and only the options given on the command line change.",
    )
    # Defaults live in SudokuTrainConfig; None here means "not given" (so --resume keeps the saved value).
    t.add_argument("--out", required=True, help="output folder (model, tokenizer, train_log.jsonl, checkpoint/)")
    t.add_argument("--resume", action="store_true", help="continue bit for bit from OUT/checkpoint")
    t.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)")
    t.add_argument("--device", default="cpu", help="where to train, e.g. cuda (default cpu); a checkpoint moves "
                   "between devices, but such a resume is not bit-identical")
    t.add_argument("--steps", type=positive_int, help="optimizer steps in total (default 2000)")
    t.add_argument("--batch-size", type=positive_int, help="puzzles per step (default 64)")
    t.add_argument("--givens", type=_givens, help="target givens: evaluated first, and the fewest training givens "
                   "unless --givens-min says otherwise (default 36)")
    t.add_argument("--eval-givens", type=_givens_list, help="more givens counts to evaluate, e.g. 45,55")
    t.add_argument("--givens-min", type=_givens, help="fewest training givens after the curriculum; the puzzle "
                   "pool is generated at this count (default: --givens)")
    t.add_argument("--givens-spread", type=_non_negative, help="training puzzles have low..low+SPREAD givens, "
                   "revealed from the pool's solutions (default 8)")
    t.add_argument("--givens-start", type=_givens, help="curriculum: low starts here and moves to --givens-min")
    t.add_argument("--curriculum-steps", type=_non_negative, help="steps of the curriculum (default 0: none)")
    t.add_argument("--lr", type=float, help="peak AdamW learning rate (default 1e-3)")
    t.add_argument("--lr-floor", type=float, help="final learning rate as a fraction of --lr (default 0.1)")
    t.add_argument("--warmup", type=_non_negative, help="linear warmup steps (default 100)")
    t.add_argument("--ar-weight", type=float, help="weight of the autoregressive prompt loss (default 1.0)")
    t.add_argument("--eval-every", type=positive_int, help="steps between evaluations and checkpoints (default 200)")
    t.add_argument("--eval-puzzles", type=positive_int, help="held-out puzzles per evaluated givens (default 64)")
    t.add_argument("--pool-size", type=positive_int, help="unique puzzles generated once and cached (default 4000)")
    t.add_argument("--hidden-size", type=positive_int, help="model width (default 128)")
    t.add_argument("--layers", type=positive_int, dest="num_layers", help="model layers (default 4)")
    t.add_argument("--experts", type=positive_int, dest="num_experts", help="MoE experts (default 4)")
    t.add_argument("--positions", choices=["base3", "default"], help="RoPE layout of a fresh model: base3 "
                   "(periods 3, 9, 27, 81, ...: the grid's structure) or Gemma's default frequencies (default base3)")
    t.add_argument("--init-from", metavar="DIR", help="start from this model's weights (e.g. the bundled demo "
                   "model) with a fresh optimizer; --hidden-size/--layers/--experts are then ignored")
    t.add_argument("--freeze-router", action="store_true", default=None, help="do not train the MoE routers")
    t.add_argument("--seed", type=seed_arg, help="seeds init, pool, data and loss draws (default 0)")
    t.set_defaults(func=run_train_sudoku)
    return recipes


def _difficulty(puzzle: str) -> str:
    givens = 81 - puzzle.count(BLANK)
    return f"{givens} givens, {81 - givens} blanks"


def _print_result(result, args, show_grid: bool, color: bool) -> None:
    if args.json:
        print(json.dumps({"puzzle": result.puzzle, "givens": 81 - result.puzzle.count(BLANK),
                          "solution": result.solution, "valid": result.valid, "steps": result.steps}), flush=True)
        return
    if show_grid:
        print(render_grid(result.puzzle, result.solution.ljust(81, "."), color=color))
    verdict = "valid" if result.valid else "NOT valid"
    print(f"{verdict} solution in {result.steps} denoising steps ({_difficulty(result.puzzle)})", flush=True)


def _puzzles(args) -> list[str]:
    """The puzzles to solve, each checked (well formed, no clashing givens, solvable) before the model runs."""
    if args.puzzle is not None:  # '' too: an empty --puzzle is an error, not a request for a random puzzle
        try:
            return [check_puzzle(args.puzzle)]
        except ValueError as error:
            raise ValueError(f"--puzzle: {error}") from None
    if args.puzzles is not None:
        puzzles = read_puzzles(args.puzzles)
        if not puzzles:
            raise ValueError(f"--puzzles {args.puzzles}: the file holds no puzzle (one 81-character puzzle per "
                             "line; blank lines and '#' comments are skipped)")
        return puzzles
    from .demo import fresh_puzzles

    return fresh_puzzles(1, args.givens, args.seed)


def run_sudoku(args) -> int:
    from .demo import evaluate_fresh, load_demo_model, seed_everything, solve_one

    puzzles = None if args.eval else _puzzles(args)  # refuse a bad puzzle before loading the model
    model, tokenizer = load_demo_model(args.model)
    seed_everything(args.seed)
    overrides = {"max_denoising_steps": args.max_steps} if args.max_steps else {}
    if args.eval:
        summary = evaluate_fresh(model, tokenizer, args.eval, args.givens, args.seed, **overrides)
        if args.json:
            print(json.dumps(summary))
        else:
            print(f"solved {summary['solve_rate']:.1%} of {summary['count']} puzzles with {args.givens} givens; "
                  f"mean {summary['mean_steps']:.1f} / median {summary['median_steps']:.1f} denoising steps")
        return 0
    color = not args.no_color and not os.environ.get("NO_COLOR") and is_terminal(sys.stdout)  # no-color.org
    animate = not (args.no_animation or args.json)
    for puzzle in puzzles:
        if not args.json:
            print(render_grid(puzzle, puzzle, color=color) + f"\npuzzle: {_difficulty(puzzle)}\n", flush=True)
        result = solve_one(model, tokenizer, puzzle, animate, ansi=color, **overrides)
        _print_result(result, args, show_grid=not animate, color=color)
    return 0


# settings a resumed run must keep: they shape the checkpoint's model, the pool it draws from, or where it started
FIXED_ON_RESUME = {"hidden_size": "--hidden-size", "num_layers": "--layers", "num_experts": "--experts",
                   "positions": "--positions", "init_from": "--init-from", "pool_size": "--pool-size", "seed": "--seed"}


def run_train_sudoku(args) -> int:
    import torch

    from .checkpoint import load_trainer_state
    from .train import SudokuTrainConfig, config_from_dict, train_sudoku

    if args.threads:
        torch.set_num_threads(args.threads)
    names = {f.name for f in dataclasses.fields(SudokuTrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if args.resume:
        saved = config_from_dict(load_trainer_state(Path(args.out) / "checkpoint")["config"])
        for name, flag in FIXED_ON_RESUME.items():  # the checkpoint's model and pool cannot change under it
            if name in given and given[name] != getattr(saved, name):
                raise ValueError(f"{flag} {given[name]} conflicts with --resume: the checkpoint in {args.out} was "
                                 f"trained with {flag} {getattr(saved, name)}; drop {flag} or train into a new --out")
        cfg = dataclasses.replace(saved, **given)
    else:
        cfg = SudokuTrainConfig(**given)
    summary = train_sudoku(cfg, resume=args.resume, device=args.device)
    if summary.get("interrupted"):
        return 130  # train_sudoku has said where the checkpoint is
    # the final evaluation was printed as the run's last progress line; say where the results are, not it again
    print(f"done at step {summary['step']}: model written to {cfg.out} (every evaluation, as JSON lines: "
          f"{Path(cfg.out) / 'train_log.jsonl'})", flush=True)
    return 0
