"""Tests of the Sudoku training data (sudoku/data.py): symmetries, revealed cells, pool cache, curriculum, batches."""

import random

from diffusiongemma.sudoku import count_solutions, is_solved, is_valid_solution, make_puzzle, sudoku_tokenizer
from diffusiongemma.sudoku.data import (
    apply_symmetry,
    curriculum_givens,
    draw_pairs,
    load_or_make_pool,
    make_batch,
    random_symmetry,
    reveal,
)


def test_symmetries_keep_puzzles_solved():
    rng = random.Random(0)
    puzzle, solution = make_puzzle(rng, 40)
    for _ in range(20):
        cells, digits = random_symmetry(rng)
        p, s = apply_symmetry(puzzle, cells, digits), apply_symmetry(solution, cells, digits)
        assert is_valid_solution(s) and is_solved(p, s) and p.count(".") == puzzle.count(".")


def test_reveal_adds_solution_cells_and_keeps_uniqueness():
    rng = random.Random(1)
    puzzle, solution = make_puzzle(rng, 30)
    easier = reveal(rng, puzzle, solution, 50)
    assert 81 - easier.count(".") == 50
    assert all(a == b for a, b in zip(puzzle, easier) if a != ".")  # old givens stay
    assert all(b == s for b, s in zip(easier, solution) if b != ".")  # new givens come from the solution
    assert count_solutions(easier) == 1 and is_solved(easier, solution)
    assert reveal(rng, puzzle, solution, 20) == puzzle  # already harder than asked: unchanged


def test_draw_pairs_respects_the_givens_range():
    rng = random.Random(2)
    pool = [make_puzzle(rng, 30) for _ in range(3)]
    counts = {81 - p.count(".") for p, s in draw_pairs(rng, pool, 40, 40, 44)}
    assert counts <= set(range(40, 45)) and len(counts) > 1


def test_pool_is_cached_and_reproducible(tmp_path):
    logs = []
    first = load_or_make_pool(tmp_path, seed=3, size=4, givens=45, log=logs.append)
    assert len(logs) == 1 and (tmp_path / "pool-G45-N4-S3.txt").exists()
    assert load_or_make_pool(tmp_path, seed=3, size=4, givens=45, log=logs.append) == first and len(logs) == 1
    assert load_or_make_pool(tmp_path / "fresh", seed=3, size=4, givens=45, log=logs.append) == first
    assert all(81 - p.count(".") == 45 and is_solved(p, s) for p, s in first)


def test_curriculum_givens():
    assert [curriculum_givens(s, 55, 35, 10) for s in (0, 5, 10, 99)] == [55, 45, 35, 35]
    assert curriculum_givens(0, 55, 35, 0) == 35


def test_batch_layout():
    tok = sudoku_tokenizer()
    puzzle, solution = make_puzzle(random.Random(1), 50)
    input_ids, labels = make_batch([(puzzle, solution)], tok)
    assert input_ids.shape == (1, 83) and labels.shape == (1, 82)
    assert input_ids[0, 0] == tok.bos_token_id and input_ids[0, -1] == tok.sep_token_id
    assert labels[0, -1] == tok.eos_token_id and tok.decode(labels[0, :81]) == solution
