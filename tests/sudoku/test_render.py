"""Tests for diffusiongemma/sudoku/render.py."""

import pytest

from diffusiongemma.sudoku.render import render_grid

# Arto Inkala's "world's hardest sudoku" (2012) and its published solution.
INKALA = "8..........36......7..9.2...5...7.......457.....1...3...1....68..85...1..9....4.."
INKALA_SOLUTION = "812753649943682175675491283154237896369845721287169534521974368438526917796318452"


def test_render_grid_plain_text():
    text = render_grid(INKALA, INKALA_SOLUTION, color=False)
    lines = text.split("\n")
    border = "+-------+-------+-------+"
    assert len(lines) == 13
    assert [lines[i] for i in (0, 4, 8, 12)] == [border] * 4
    assert lines[1] == "| 8 1 2 | 7 5 3 | 6 4 9 |"  # first row of INKALA_SOLUTION
    assert "\033" not in text


def test_render_grid_shows_blanks_as_dots():
    lines = render_grid(INKALA, INKALA.replace(".", "0"), color=False).split("\n")
    assert lines[1] == "| 8 . . | . . . | . . . |"


def test_render_grid_colours_givens_filled_and_changed():
    bold, cyan, changed = "\033[1m", "\033[36m", "\033[30;43m"
    blanks = INKALA.count(".")  # 60 cells filled by the solution
    text = render_grid(INKALA, INKALA_SOLUTION)
    assert text.count(bold) == 81 - blanks
    assert text.count(cyan) == blanks
    assert changed not in text
    # Against the bare puzzle, exactly the filled cells changed.
    assert render_grid(INKALA, INKALA_SOLUTION, previous=INKALA).count(changed) == blanks
    # '0' and '.' are both blank, so switching between them is not a change.
    assert changed not in render_grid(INKALA, INKALA, previous=INKALA.replace(".", "0"))


def test_render_grid_rejects_wrong_length():
    with pytest.raises(ValueError, match="cells must be 81 characters; got 80"):
        render_grid(INKALA, INKALA_SOLUTION[:80])


def test_render_grid_highlights_revised_cells():
    changed = "\033[30;43m"
    first_blank = INKALA.index(".")
    text = render_grid(INKALA, INKALA_SOLUTION, revised=[first_blank])
    assert text.count(changed) == 1 and f"{changed}{INKALA_SOLUTION[first_blank]}" in text
    assert changed not in render_grid(INKALA, INKALA_SOLUTION, revised=[first_blank], color=False)
