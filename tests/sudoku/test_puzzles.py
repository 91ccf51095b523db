"""Tests for diffusiongemma/sudoku/puzzles.py."""

import random

import pytest

from diffusiongemma.sudoku.puzzles import (
    check_puzzle,
    count_solutions,
    is_consistent,
    is_solved,
    is_valid_solution,
    make_puzzle,
    parse_puzzle,
    random_solution,
    read_puzzles,
    solve,
)

# Arto Inkala's "world's hardest sudoku" (2012) and Peter Norvig's hard1, with their published solutions.
INKALA = "8..........36......7..9.2...5...7.......457.....1...3...1....68..85...1..9....4.."
INKALA_SOLUTION = "812753649943682175675491283154237896369845721287169534521974368438526917796318452"
NORVIG = "4.....8.5.3..........7......2.....6.....8.4......1.......6.3.7.5..2.....1.4......"
NORVIG_SOLUTION = "417369825632158947958724316825437169791586432346912758289643571573291684164875293"


def swapped(grid: str, i: int, j: int) -> str:
    """Return `grid` with cells i and j exchanged."""
    cells = list(grid)
    cells[i], cells[j] = cells[j], cells[i]
    return "".join(cells)


# --- generating ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_solution_is_valid(seed):
    assert is_valid_solution(random_solution(random.Random(seed)))


def test_random_solution_is_reproducible_and_varies_with_seed():
    assert random_solution(random.Random(7)) == random_solution(random.Random(7))
    assert len({random_solution(random.Random(seed)) for seed in range(5)}) == 5


@pytest.mark.parametrize("givens", [30, 36, 45])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_make_puzzle_is_unique_with_requested_givens(givens, seed):
    puzzle, solution = make_puzzle(random.Random(seed), givens=givens)
    assert 81 - puzzle.count(".") == givens
    assert count_solutions(puzzle) == 1
    assert solve(puzzle) == solution
    assert is_solved(puzzle, solution)


def test_make_puzzle_without_uniqueness_keeps_exactly_givens():
    puzzle, solution = make_puzzle(random.Random(0), givens=17, unique=False)
    assert 81 - puzzle.count(".") == 17
    assert is_solved(puzzle, solution)
    # 17 random givens almost never pin the grid down; this seed gives several solutions.
    assert count_solutions(puzzle) == 2


def test_make_puzzle_at_very_low_givens_stays_unique():
    # Greedy removal stalls above 17 givens; it must stop there rather than give up uniqueness.
    puzzle, solution = make_puzzle(random.Random(0), givens=17)
    assert 81 - puzzle.count(".") >= 17
    assert count_solutions(puzzle) == 1
    assert is_solved(puzzle, solution)


@pytest.mark.parametrize("givens", [16, 82])
def test_make_puzzle_rejects_givens_out_of_range(givens):
    with pytest.raises(ValueError, match=f"givens must be in 17..81; got {givens}"):
        make_puzzle(random.Random(0), givens=givens)


def test_make_puzzle_is_reproducible():
    assert make_puzzle(random.Random(3), givens=30) == make_puzzle(random.Random(3), givens=30)


# --- solving ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "puzzle, solution", [(INKALA, INKALA_SOLUTION), (NORVIG, NORVIG_SOLUTION)], ids=["inkala", "norvig"]
)
def test_solve_known_hard_puzzle(puzzle, solution):
    assert solve(puzzle) == solution
    assert count_solutions(puzzle) == 1


def test_solve_accepts_zero_as_blank():
    assert solve(INKALA.replace(".", "0")) == INKALA_SOLUTION


def test_solve_returns_none_for_clashing_givens():
    clash = "55" + "." * 79  # two 5s in row 0
    assert solve(clash) is None
    assert count_solutions(clash) == 0


def test_solve_returns_none_when_a_cell_has_no_candidate():
    # Row 0 holds 1-8 and column 0 holds a 9 further down, so cell 0 can take nothing.
    dead_end = ".12345678" + "9" + "." * 71
    assert solve(dead_end) is None
    assert count_solutions(dead_end) == 0


def test_count_solutions_stops_at_limit():
    empty = "." * 81
    assert count_solutions(empty) == 2
    assert count_solutions(empty, limit=5) == 5
    assert count_solutions(INKALA, limit=5) == 1


def test_count_solutions_rejects_limit_below_one():
    with pytest.raises(ValueError, match="limit"):
        count_solutions(INKALA, limit=0)


# --- checking -----------------------------------------------------------------------------------------------


def test_is_valid_solution_accepts_solution():
    assert is_valid_solution(INKALA_SOLUTION)


def test_is_valid_solution_rejects_row_duplicate_only():
    # Cells 0 and 9 share column 0 and box 0, so the swap keeps both intact and breaks rows 0 and 1.
    grid = swapped(INKALA_SOLUTION, 0, 9)
    assert not is_valid_solution(grid)


def test_is_valid_solution_rejects_column_duplicate_only():
    # Cells 0 and 1 share row 0 and box 0, so only columns 0 and 1 break.
    assert not is_valid_solution(swapped(INKALA_SOLUTION, 0, 1))


def test_is_valid_solution_rejects_box_duplicate_only():
    # Cyclic Latin square: every row and column is a permutation, but box 0 holds 1,2,3 / 2,3,4 / 3,4,5.
    latin = "".join(str((r + c) % 9 + 1) for r in range(9) for c in range(9))
    assert not is_valid_solution(latin)


@pytest.mark.parametrize(
    "grid",
    [INKALA_SOLUTION[:80], INKALA_SOLUTION + "1", "." + INKALA_SOLUTION[1:], "0" + INKALA_SOLUTION[1:]],
    ids=["short", "long", "blank", "zero"],
)
def test_is_valid_solution_rejects_malformed(grid):
    assert not is_valid_solution(grid)


def test_is_consistent_checks_givens_only():
    assert is_consistent(INKALA, INKALA_SOLUTION)
    assert is_consistent(INKALA.replace(".", "0"), INKALA_SOLUTION)
    # Cell 0 is a given 8; changing it breaks consistency even though blanks may hold anything.
    assert not is_consistent(INKALA, "9" + INKALA_SOLUTION[1:])
    assert is_consistent(INKALA, INKALA.replace(".", "1"))


def test_is_solved_needs_valid_and_consistent():
    assert is_solved(INKALA, INKALA_SOLUTION)
    # Relabel digits 1<->2: still a valid grid, but the given 2 at cell 24 (row 2) no longer matches.
    relabelled = INKALA_SOLUTION.translate(str.maketrans("12", "21"))
    assert is_valid_solution(relabelled)
    assert not is_solved(INKALA, relabelled)
    # The puzzle itself is consistent with itself but not a full grid.
    assert not is_solved(INKALA, INKALA)


# --- parsing and reading ------------------------------------------------------------------------------------


def test_parse_puzzle_normalises_zero_and_whitespace():
    assert parse_puzzle("  " + INKALA.replace(".", "0") + "\n") == INKALA


def test_parse_puzzle_reports_length():
    with pytest.raises(ValueError) as error:
        parse_puzzle(INKALA[:80])
    assert str(error.value) == "puzzle must be 81 characters of 1-9, '.' or '0'; got 80 characters"


def test_parse_puzzle_reports_bad_character():
    with pytest.raises(ValueError) as error:
        parse_puzzle(INKALA[:5] + "x" + INKALA[6:])
    assert str(error.value) == "puzzle must be 81 characters of 1-9, '.' or '0'; got 'x' at index 5"


def test_read_puzzles_skips_comments_and_blank_lines(tmp_path):
    path = tmp_path / "puzzles.txt"
    path.write_text(f"# two puzzles\n\n{INKALA}\n   \n{NORVIG.replace('.', '0')}\n")
    assert read_puzzles(path) == [INKALA, NORVIG]


def test_read_puzzles_names_bad_line(tmp_path):
    path = tmp_path / "puzzles.txt"
    path.write_text(f"# header\n{INKALA}\n\n{INKALA[:80]}\n")
    with pytest.raises(ValueError, match=r"line 4: puzzle must be 81 characters .* got 80 characters"):
        read_puzzles(path)


def test_an_unsolvable_puzzle_is_refuted_quickly():
    """Norvig's impossible puzzle: no two givens clash, yet no grid completes it. Cell-only branching took minutes;
    branching also on a unit's digit with the fewest places refutes it in seconds."""
    import time

    start = time.monotonic()
    with pytest.raises(ValueError, match="has no solution"):
        check_puzzle(".....5.8....6.1.43..........1.5........1.6...3.......553.....61........4.........")
    assert time.monotonic() - start < 30


def test_read_puzzles_names_a_binary_file(tmp_path):
    path = tmp_path / "puzzles.bin"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    with pytest.raises(ValueError, match="puzzles.bin is not a text file"):
        read_puzzles(path)
