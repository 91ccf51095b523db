"""Sudoku building blocks: puzzle generation, solving, checking, rendering, and a character-level tokenizer."""

from .puzzles import (
    BLANK,
    DIGITS,
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
from .render import render_grid
from .rope_warning import install as _install_rope_warning_filter
from .tokenizer import VOCAB, decode_solution, encode_puzzle, sudoku_tokenizer

_install_rope_warning_filter()  # the demo model's RoPE `factor` is read, not unrecognized (see rope_warning.py)

__all__ = [
    "BLANK",
    "DIGITS",
    "VOCAB",
    "count_solutions",
    "decode_solution",
    "encode_puzzle",
    "is_consistent",
    "is_solved",
    "is_valid_solution",
    "make_puzzle",
    "parse_puzzle",
    "random_solution",
    "read_puzzles",
    "render_grid",
    "solve",
    "sudoku_tokenizer",
]
