"""Command-line entry points of the Sudoku demo, plugged into `diffusiongemma` by `add_sudoku_commands`.

    diffusiongemma sudoku                      solve a fresh random puzzle, animating each denoising step
    diffusiongemma sudoku --puzzle '53..7....'  solve one given puzzle (81 cells, '.' or '0' for blanks)
    diffusiongemma sudoku --puzzles FILE       solve each puzzle of a file (one per line)
    diffusiongemma sudoku --eval N             solve rate and mean steps on N fresh puzzles
    diffusiongemma train sudoku --out DIR      train a Sudoku model (see sudoku/train.py)
"""

import argparse
import json

from ..cli import positive_int
from .puzzles import parse_puzzle, read_puzzles, render_grid


def _givens(text: str) -> int:
    value = int(text)
    if not 17 <= value <= 81:
        raise argparse.ArgumentTypeError(f"--givens must be in 17..81, got {value}")
    return value


def add_sudoku_commands(subparsers) -> None:
    """Register `sudoku` and `train sudoku` on the main parser's subparsers."""
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
    p.add_argument("--givens", type=_givens, default=36, help="filled cells of generated puzzles (default 36)")
    p.add_argument("--seed", type=int, default=None, help="seed puzzle generation and denoising")
    p.add_argument("--model", default=None, help="model folder (default: the bundled demo model)")
    p.add_argument("--max-steps", type=positive_int, default=None, help="max denoising steps (default: the model's)")
    p.add_argument("--no-animation", action="store_true", help="do not redraw the grid at every step")
    p.add_argument("--json", action="store_true", help="print JSON: one line per puzzle, or one for --eval")
    p.set_defaults(func=run_sudoku)

    train = subparsers.add_parser("train", help="train a small DiffusionGemma", description="Training recipes.")
    recipes = train.add_subparsers(dest="recipe", metavar="RECIPE", required=True)
    t = recipes.add_parser(
        "sudoku",
        help="train a Sudoku solver on generated puzzles (CPU is fine)",
        description="Train a tiny DiffusionGemma on generated puzzles with the block-diffusion loss; evaluates the "
        "solve rate on held-out puzzles every --eval-every steps and writes a resumable checkpoint.",
    )
    t.add_argument("--out", required=True, help="output folder (model, tokenizer, train_log.jsonl, checkpoint/)")
    t.add_argument("--steps", type=positive_int, default=2000, help="optimizer steps (default 2000)")
    t.add_argument("--batch-size", type=positive_int, default=64, help="puzzles per step (default 64)")
    t.add_argument("--givens", type=_givens, default=36,
                   help="difficulty: evaluation puzzles have this many givens, training ones up to --givens-spread "
                   "more (default 36)")
    t.add_argument("--givens-spread", type=int, default=8, help="extra givens of training puzzles (default 8)")
    t.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate (default 1e-3)")
    t.add_argument("--warmup", type=int, default=100, help="linear warmup steps (default 100)")
    t.add_argument("--eval-every", type=positive_int, default=200, help="steps between evaluations (default 200)")
    t.add_argument("--eval-puzzles", type=positive_int, default=64, help="held-out puzzles per evaluation")
    t.add_argument("--pool-size", type=positive_int, default=4000, help="unique puzzles generated up front")
    t.add_argument("--hidden-size", type=positive_int, default=128)
    t.add_argument("--layers", type=positive_int, default=4)
    t.add_argument("--experts", type=positive_int, default=4)
    t.add_argument("--freeze-router", action="store_true", help="do not train the MoE routers")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    t.set_defaults(func=run_train_sudoku)


def _print_result(result, args, show_grid: bool) -> None:
    if args.json:
        print(json.dumps({"puzzle": result.puzzle, "solution": result.solution, "valid": result.valid,
                          "steps": result.steps}), flush=True)
        return
    if show_grid:
        print(render_grid(result.puzzle, result.solution.ljust(81, ".")))
    verdict = "valid" if result.valid else "NOT valid"
    print(f"{verdict} solution in {result.steps} denoising steps", flush=True)


def run_sudoku(args) -> int:
    from .demo import evaluate_fresh, fresh_puzzles, load_demo_model, seed_everything, solve_one

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
    if args.puzzle:
        puzzles = [parse_puzzle(args.puzzle)]
    elif args.puzzles:
        puzzles = read_puzzles(args.puzzles)
    else:
        puzzles = fresh_puzzles(1, args.givens, args.seed)
    animate = not (args.no_animation or args.json)
    for puzzle in puzzles:
        if not args.json:
            print(render_grid(puzzle, puzzle) + "\npuzzle\n", flush=True)
        result = solve_one(model, tokenizer, puzzle, animate, **overrides)
        _print_result(result, args, show_grid=not animate)
    return 0


def run_train_sudoku(args) -> int:
    from .train import SudokuTrainConfig, train_sudoku

    cfg = SudokuTrainConfig(
        out=args.out, steps=args.steps, batch_size=args.batch_size, givens=args.givens,
        givens_spread=args.givens_spread, lr=args.lr, warmup=args.warmup, eval_every=args.eval_every,
        eval_puzzles=args.eval_puzzles,
        seed=args.seed, pool_size=args.pool_size, hidden_size=args.hidden_size, num_layers=args.layers,
        num_experts=args.experts, freeze_router=args.freeze_router,
    )
    summary = train_sudoku(cfg, resume=args.resume)
    print(json.dumps(summary))
    return 0
