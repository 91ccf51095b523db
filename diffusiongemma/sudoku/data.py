"""Training data of the Sudoku recipe: a cached pool of hard puzzles, symmetries, revealed cells and a curriculum.

Generating a uniquely solvable puzzle costs a uniqueness check per blanked cell (about 8 ms at 36 givens, 15 ms at
30), so the pool is generated once, at the LOWEST givens count of the run, and cached in the output folder. Every
draw then makes it as easy as the curriculum asks for free: revealing extra cells of the known solution keeps the
puzzle uniquely solvable (a superset of givens that already forces one solution still forces it). A random Sudoku
symmetry (digit relabelling, row/column shuffles inside bands/stacks, band/stack shuffles, transposition) on top
makes the data effectively endless.

Legend: B batch, P prompt length (83), L canvas length (82).
"""

import random
from pathlib import Path

import torch

from .puzzles import BLANK, make_puzzle
from .tokenizer import encode_puzzle

Pair = tuple[str, str]  # (puzzle, solution), 81 characters each


def random_symmetry(rng: random.Random) -> tuple[list[int], str]:
    """A random validity-preserving Sudoku transform: (cell permutation [81], digit relabelling of '123456789')."""

    def shuffled_lines() -> list[int]:  # shuffle the 3 bands, and the 3 lines inside each band
        bands = rng.sample(range(3), 3)
        return [3 * b + i for b in bands for i in rng.sample(range(3), 3)]

    rows, cols = shuffled_lines(), shuffled_lines()
    transpose = rng.random() < 0.5
    cells = [(9 * rows[c] + cols[r]) if transpose else (9 * rows[r] + cols[c]) for r in range(9) for c in range(9)]
    return cells, "".join(rng.sample("123456789", 9))


def apply_symmetry(grid: str, cells: list[int], digits: str) -> str:
    """Move cell cells[i] to cell i and relabel digit d as digits[d-1]; blanks stay blanks."""
    return "".join(digits[int(grid[j]) - 1] if grid[j].isdigit() else grid[j] for j in cells)


def reveal(rng: random.Random, puzzle: str, solution: str, givens: int) -> str:
    """`puzzle` with random blank cells filled from `solution` until it has at least `givens` givens.

    A puzzle with a unique solution keeps it when more of that solution is revealed, so this is a free way to get
    any easier puzzle from a hard one. A puzzle that already has `givens` or more is returned unchanged.
    """
    blanks = [i for i, c in enumerate(puzzle) if c == BLANK]
    missing = givens - (81 - len(blanks))
    if missing <= 0:
        return puzzle
    cells = list(puzzle)
    for i in rng.sample(blanks, missing):
        cells[i] = solution[i]
    return "".join(cells)


def make_pool(rng: random.Random, size: int, givens: int) -> list[Pair]:
    """`size` uniquely solvable (puzzle, solution) pairs with `givens` givens (more where greedy removal stalls)."""
    return [make_puzzle(rng, givens) for _ in range(size)]


def load_or_make_pool(folder: Path, seed: int, size: int, givens: int, log=print) -> list[Pair]:
    """The pool of a run, read from `folder/pool-G{givens}-N{size}-S{seed}.txt` or generated and written there.

    The file holds one 'puzzle solution' line per pair; the same seed always generates the same pool, so the cache
    only saves time (a resumed run on a fresh machine regenerates it identically).
    """
    path = Path(folder) / f"pool-G{givens}-N{size}-S{seed}.txt"
    if path.exists():
        pairs = [tuple(line.split()) for line in path.read_text().splitlines() if line.strip()]
        if len(pairs) == size and all(len(p) == 2 and len(p[0]) == len(p[1]) == 81 for p in pairs):
            return pairs
        log(f"ignoring the malformed pool cache {path}")
    log(f"generating a pool of {size} puzzles with {givens} givens (cached in {path.name})")
    pool = make_pool(random.Random(f"sudoku-pool-{seed}"), size, givens)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{p} {s}\n" for p, s in pool))
    tmp.replace(path)
    return pool


def curriculum_givens(step: int, start: int, end: int, steps: int) -> int:
    """Lowest givens of training puzzles at `step`: linear from `start` to `end` over `steps`, then `end`."""
    if steps <= 0 or step >= steps:
        return end
    return round(start + (end - start) * step / steps)


def draw_pairs(rng: random.Random, pool: list[Pair], count: int, low: int, high: int) -> list[Pair]:
    """`count` training pairs: a pool entry, revealed up to U{low..high} givens, under a random symmetry.

    Draw order per pair (part of the resume contract): pool index, givens, revealed cells, symmetry.
    """
    pairs = []
    for puzzle, solution in rng.choices(pool, k=count):
        puzzle = reveal(rng, puzzle, solution, rng.randint(low, high))
        cells, digits = random_symmetry(rng)
        pairs.append((apply_symmetry(puzzle, cells, digits), apply_symmetry(solution, cells, digits)))
    return pairs


def make_batch(pairs: list[Pair], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(puzzle, solution) pairs -> input_ids [B, P] and labels [B, L] (solution digits, then <eos>)."""
    input_ids = [encode_puzzle(tokenizer, p) for p, _ in pairs]
    labels = [tokenizer.encode(s, add_special_tokens=False) + [tokenizer.eos_token_id] for _, s in pairs]
    return torch.tensor(input_ids), torch.tensor(labels)


def held_out_puzzles(seed: int, count: int, givens: int) -> list[str]:
    """Evaluation puzzles from their own seed, disjoint in practice from the training pool."""
    rng = random.Random(f"sudoku-eval-{seed}-{givens}")
    return [make_puzzle(rng, givens)[0] for _ in range(count)]
