"""Writes the JSONL data of the Sudoku tasks in this folder (committed; rerun to regenerate):

    python tests/evaluation/tasks/make_sudoku_data.py

sudoku_36.jsonl: the 50 puzzles of `diffusiongemma sudoku --eval 50 --givens 36 --seed 0` (`fresh_puzzles`), in
that order, with their solutions and, for the multiple-choice task, three wrong grids: the solution with two blank
cells of different digits swapped (the givens still hold, the grid is not a solution).
"""

import json
import random
from pathlib import Path

from diffusiongemma.sudoku.demo import fresh_puzzles
from diffusiongemma.sudoku.puzzles import BLANK, is_solved, solve

COUNT, GIVENS, SEED = 50, 36, 0


def swapped(solution: str, puzzle: str, rng: random.Random) -> str:
    blanks = [i for i, c in enumerate(puzzle) if c == BLANK]
    while True:
        a, b = rng.sample(blanks, 2)
        if solution[a] != solution[b]:
            cells = list(solution)
            cells[a], cells[b] = cells[b], cells[a]
            return "".join(cells)


def main() -> None:
    rng = random.Random("sudoku-choice")
    out = Path(__file__).with_name(f"sudoku_{GIVENS}.jsonl")
    with out.open("w") as f:
        for puzzle in fresh_puzzles(COUNT, GIVENS, SEED):
            solution = solve(puzzle)
            assert is_solved(puzzle, solution)
            wrong = set()
            while len(wrong) < 3:
                wrong.add(swapped(solution, puzzle, rng))
            choices = [solution, *sorted(wrong)]
            rng.shuffle(choices)  # the correct grid at a random place
            f.write(json.dumps({"puzzle": puzzle, "solution": solution, "choices": choices,
                                "gold": choices.index(solution)}) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
