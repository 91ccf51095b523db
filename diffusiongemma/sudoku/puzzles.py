"""Sudoku puzzles as 81-character strings: generate, solve, check, parse and read (rendering: render.py).

A grid is a row-major string of 81 characters: '1'-'9' for digits and '.' for blanks. Input may use '0' for
blanks; `parse_puzzle` normalises it to '.'. Cell i sits in row i // 9, column i % 9, box 3 * (row // 3) +
col // 3.

The solver keeps one 9-bit candidate mask per row, column and box (bit d set means digit d is still free) and
always branches on the empty cell with the fewest candidates (MRV). That solves hard puzzles in milliseconds,
which is what `make_puzzle` needs: it asks "still unique?" once per removed cell.
"""

from __future__ import annotations

import random
from pathlib import Path

BLANK = "."
DIGITS = "123456789"
_BLANK_INPUTS = ".0"
_FULL = 0x3FE  # bits 1..9 set: every digit free
_PARSE_EXPECTED = "puzzle must be 81 characters of 1-9, '.' or '0'"

_ROW = [i // 9 for i in range(81)]
_COL = [i % 9 for i in range(81)]
_BOX = [3 * (i // 27) + (i % 9) // 3 for i in range(81)]
_UNITS = (
    [[9 * r + c for c in range(9)] for r in range(9)]  # rows
    + [[9 * r + c for r in range(9)] for c in range(9)]  # columns
    + [[9 * (3 * (b // 3) + r) + 3 * (b % 3) + c for r in range(3) for c in range(3)] for b in range(9)]  # boxes
)


# ---------------------------------------------------------------------------------------------------------------
# Parsing and reading


def parse_puzzle(text: str) -> str:
    """Return `text` as a normalised puzzle string.

    Args:
        text: 81 characters of '1'-'9', '.' or '0' (blank). Surrounding whitespace is ignored.

    Returns:
        The 81-character puzzle with every blank written as '.'.

    Raises:
        ValueError: if `text` is not 81 characters long or holds another character.
    """
    stripped = text.strip()
    if len(stripped) != 81:
        raise ValueError(f"{_PARSE_EXPECTED}; got {len(stripped)} characters")
    for index, char in enumerate(stripped):
        if char not in DIGITS and char not in _BLANK_INPUTS:
            raise ValueError(f"{_PARSE_EXPECTED}; got {char!r} at index {index}")
    return stripped.replace("0", BLANK)


def givens_clash(puzzle: str) -> str | None:
    """Return the first rule broken by the givens of `puzzle` (two equal digits in one row, column or box), or None.

    Args:
        puzzle: 81 characters, see `parse_puzzle`.

    Returns:
        e.g. "digit 5 appears twice in row 3 (columns 2 and 7)", rows, columns and boxes counted from 1 (boxes
        left to right, top to bottom); None when no two givens clash.
    """
    cells = parse_puzzle(puzzle)
    for kind, where in (("row", _ROW), ("column", _COL), ("box", _BOX)):
        seen: dict[tuple[int, str], int] = {}  # (unit, digit) -> first cell holding it
        for i, char in enumerate(cells):
            if char == BLANK:
                continue
            first = seen.setdefault((where[i], char), i)
            if first != i:
                cells_named = ", ".join(f"row {c // 9 + 1} column {c % 9 + 1}" for c in (first, i))
                return f"digit {char} appears twice in {kind} {where[i] + 1} ({cells_named})"
    return None


def check_puzzle(text: str) -> str:
    """Return `text` as a normalised puzzle that has a solution.

    Args:
        text: 81 characters, see `parse_puzzle`.

    Returns:
        The 81-character puzzle with '.' blanks.

    Raises:
        ValueError: if `text` is malformed (see `parse_puzzle`), two givens clash (naming them, see
            `givens_clash`), or the givens admit no solution.
    """
    puzzle = parse_puzzle(text)
    clash = givens_clash(puzzle)
    if clash is not None:
        raise ValueError(f"the puzzle breaks the rules: {clash}")
    if not _search(_digits_of(puzzle), limit=1):
        raise ValueError("the puzzle has no solution: no two givens clash, but no grid completes them")
    return puzzle


def read_puzzles(path: str | Path) -> list[str]:
    """Return the puzzles in a text file, one per line.

    Blank lines and lines starting with '#' are skipped.

    Args:
        path: file to read.

    Returns:
        The normalised puzzles (see `parse_puzzle`), in file order; each has a solution (see `check_puzzle`).

    Raises:
        ValueError: naming the file and the 1-based line number of the first malformed, contradictory or
            unsolvable puzzle.
    """
    puzzles = []
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not a text file (byte {error.start} is not UTF-8): one puzzle per line "
                         "expected") from None
    for line_number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            puzzles.append(check_puzzle(stripped))
        except ValueError as error:
            raise ValueError(f"{path}, line {line_number}: {error}") from None
    return puzzles


# ---------------------------------------------------------------------------------------------------------------
# Solving


def _digits_of(puzzle: str) -> list[int]:
    """Return the 81 cells of a parsed puzzle as ints, 0 for blank."""
    return [0 if char == BLANK else int(char) for char in puzzle]


def _search(cells: list[int], limit: int, rng: random.Random | None = None) -> list[list[int]]:
    """Return up to `limit` completions of `cells` (0 = blank); an empty list when none exists.

    Tries candidates in ascending order, or shuffled by `rng` when given (used to draw random full grids).
    """
    rows, cols, boxes = [_FULL] * 9, [_FULL] * 9, [_FULL] * 9
    for i, digit in enumerate(cells):
        if digit:
            bit = 1 << digit
            if not rows[_ROW[i]] & cols[_COL[i]] & boxes[_BOX[i]] & bit:
                return []  # the givens already clash
            rows[_ROW[i]] ^= bit
            cols[_COL[i]] ^= bit
            boxes[_BOX[i]] ^= bit
    grid = list(cells)
    empty = [i for i in range(81) if not grid[i]]
    found: list[list[int]] = []

    def place(i: int, digit: int) -> None:  # toggles: the same call undoes it
        bit = 1 << digit
        grid[i] = digit if not grid[i] else 0
        rows[_ROW[i]] ^= bit
        cols[_COL[i]] ^= bit
        boxes[_BOX[i]] ^= bit

    def recurse() -> None:
        # MRV: branch on the empty cell with the fewest candidates ...
        best, best_mask, best_count = -1, 0, 10
        for i in empty:
            if grid[i]:
                continue
            mask = rows[_ROW[i]] & cols[_COL[i]] & boxes[_BOX[i]]
            count = mask.bit_count()
            if count < best_count:
                best, best_mask, best_count = i, mask, count
                if count <= 1:
                    break
        if best < 0:
            found.append(list(grid))
            return
        if best_count == 0:
            return
        choices = [(best, d) for d in range(1, 10) if best_mask >> d & 1]
        if rng is None and best_count > 1:
            # ... or on the digit with the fewest places left in some row, column or box (hidden singles; both
            # halves of the exact-cover choice). Without it, puzzles with no solution can take minutes to refute.
            # Random grids (rng given) keep the cell-only order, so a seed draws the grid it always drew.
            for unit in _UNITS:
                free = 0
                for i in unit:
                    if not grid[i]:
                        free |= rows[_ROW[i]] & cols[_COL[i]] & boxes[_BOX[i]]
                placed = 0
                for i in unit:
                    if grid[i]:
                        placed |= 1 << grid[i]
                if (free | placed) != _FULL:
                    return  # a digit has no place left in this unit
                for digit in range(1, 10):
                    bit = 1 << digit
                    if placed & bit:
                        continue
                    places = [i for i in unit if not grid[i] and rows[_ROW[i]] & cols[_COL[i]] & boxes[_BOX[i]] & bit]
                    if len(places) < len(choices):
                        choices = [(i, digit) for i in places]
                        if len(choices) == 1:
                            break
                if len(choices) == 1:
                    break
        if rng is not None:
            rng.shuffle(choices)
        for i, digit in choices:
            place(i, digit)
            recurse()
            place(i, digit)
            if len(found) >= limit:
                return

    recurse()
    return found


def solve(puzzle: str) -> str | None:
    """Return the first solution of `puzzle`, or None when it has none.

    Args:
        puzzle: 81 characters, see `parse_puzzle`.

    Returns:
        The 81-digit solution (the unique one for a proper puzzle), or None.
    """
    solutions = _search(_digits_of(parse_puzzle(puzzle)), limit=1)
    return "".join(map(str, solutions[0])) if solutions else None


def count_solutions(puzzle: str, limit: int = 2) -> int:
    """Return the number of solutions of `puzzle`, counting no further than `limit`.

    Args:
        puzzle: 81 characters, see `parse_puzzle`.
        limit: stop counting here; 2 is enough to tell "unique" from "not unique".

    Returns:
        min(number of solutions, limit).
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1; got {limit}")
    return len(_search(_digits_of(parse_puzzle(puzzle)), limit=limit))


# ---------------------------------------------------------------------------------------------------------------
# Checking


def is_valid_solution(solution: str) -> bool:
    """Return whether `solution` is a complete, rule-abiding grid.

    Args:
        solution: candidate grid.

    Returns:
        True when it is 81 digits 1-9 and every row, column and box holds each digit once.
    """
    if len(solution) != 81 or any(char not in DIGITS for char in solution):
        return False
    return all(len({solution[i] for i in unit}) == 9 for unit in _UNITS)


def is_consistent(puzzle: str, solution: str) -> bool:
    """Return whether `solution` keeps every given of `puzzle`.

    Args:
        puzzle: 81 characters; '.' and '0' are blanks.
        solution: 81-character candidate grid.

    Returns:
        True when both are 81 characters and every non-blank cell of `puzzle` equals the cell of `solution`.
    """
    if len(puzzle) != 81 or len(solution) != 81:
        return False
    return all(given in _BLANK_INPUTS or given == filled for given, filled in zip(puzzle, solution))


def is_solved(puzzle: str, candidate: str) -> bool:
    """Return whether `candidate` is a valid solution that keeps every given of `puzzle`.

    Args:
        puzzle: 81 characters; '.' and '0' are blanks.
        candidate: 81-character grid, e.g. a model's decoded output.

    Returns:
        `is_valid_solution(candidate) and is_consistent(puzzle, candidate)`.
    """
    return is_valid_solution(candidate) and is_consistent(puzzle, candidate)


# ---------------------------------------------------------------------------------------------------------------
# Generating


def random_solution(rng: random.Random) -> str:
    """Return a random complete grid.

    Fills an empty grid by backtracking with shuffled candidate order, so every valid grid can come out (not
    exactly uniformly: MRV tie-breaking and shuffling bias the draw slightly).

    Args:
        rng: the only source of randomness, so a seeded `random.Random` gives a reproducible grid.

    Returns:
        81 digits forming a valid grid.
    """
    (grid,) = _search([0] * 81, limit=1, rng=rng)
    return "".join(map(str, grid))


def make_puzzle(rng: random.Random, givens: int = 36, unique: bool = True) -> tuple[str, str]:
    """Return a random puzzle with `givens` filled cells, and its solution.

    Draws a full grid, then blanks cells in a random order. With `unique`, a cell is blanked only if the puzzle
    still has exactly one solution; cells that would break uniqueness stay given. Greedy removal usually stalls
    somewhere around 22-28 givens, so below that the puzzle may keep MORE than `givens` cells: it stops at the
    lowest count it could reach. Check `81 - puzzle.count('.')` when the exact count matters.

    Args:
        rng: the only source of randomness.
        givens: filled cells to keep, 17..81 (17 is the fewest any uniquely solvable puzzle has).
        unique: keep the solution unique. Without it, exactly `givens` cells are kept and the puzzle may have
            several solutions, of which the returned one is the grid it was cut from.

    Returns:
        (puzzle, solution): puzzle with '.' blanks, and the 81-digit solution.

    Raises:
        ValueError: if `givens` is outside 17..81.
    """
    if not 17 <= givens <= 81:
        raise ValueError(f"givens must be in 17..81; got {givens}")
    solution = random_solution(rng)
    cells = _digits_of(solution)
    order = list(range(81))
    rng.shuffle(order)
    remaining = 81
    for i in order:
        if remaining == givens:
            break
        kept, cells[i] = cells[i], 0
        if unique and len(_search(cells, limit=2)) != 1:
            cells[i] = kept  # blanking i would admit a second solution
            continue
        remaining -= 1
    puzzle = "".join(str(d) if d else BLANK for d in cells)
    return puzzle, solution
