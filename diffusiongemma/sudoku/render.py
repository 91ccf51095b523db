"""A Sudoku grid drawn for a terminal: box lines, givens bold, filled cells cyan, changed cells highlighted."""

from __future__ import annotations

from collections.abc import Collection

from .puzzles import _BLANK_INPUTS, BLANK

_RESET = "\033[0m"
_GIVEN_STYLE = "\033[1m"  # bold
_FILLED_STYLE = "\033[36m"  # cyan
_CHANGED_STYLE = "\033[30;43m"  # black on yellow


def _cell_style(given: bool, filled: bool, changed: bool) -> str:
    """Return the ANSI style of one cell: changed beats given beats filled; blank cells are unstyled."""
    if changed:
        return _CHANGED_STYLE
    if given:
        return _GIVEN_STYLE
    return _FILLED_STYLE if filled else ""


def render_grid(
    puzzle: str, cells: str, previous: str | None = None, color: bool = True, revised: Collection[int] = ()
) -> str:
    """Return a 9x9 text grid with box lines, for a terminal.

    Example (color=False)::

        +-------+-------+-------+
        | 5 3 . | . 7 . | . . . |
        ...

    Args:
        puzzle: the 81-character puzzle; its non-blank cells are givens, drawn bold.
        cells: the 81 characters to show, e.g. the current canvas. Non-blank cells that are blank in `puzzle`
            are drawn in cyan.
        previous: the grid shown last time; cells that differ from it are highlighted (black on yellow).
        revised: indices of cells to highlight the same way (e.g. cells whose digit changed after it appeared).
        color: emit ANSI escape codes; with False the output is plain text.

    Returns:
        13 lines joined by newlines, without a trailing newline.
    """
    for name, grid in (("puzzle", puzzle), ("cells", cells), ("previous", previous)):
        if grid is not None and len(grid) != 81:
            raise ValueError(f"{name} must be 81 characters; got {len(grid)}")
    cells = cells.replace("0", BLANK)
    previous = previous.replace("0", BLANK) if previous is not None else None
    revised = set(revised)
    border = "+-------+-------+-------+"
    lines = [border]
    for r in range(9):
        parts = ["|"]
        for c in range(9):
            i = 9 * r + c
            char = cells[i]
            if color:
                style = _cell_style(
                    given=puzzle[i] not in _BLANK_INPUTS,
                    filled=char != BLANK,
                    changed=(previous is not None and previous[i] != cells[i]) or i in revised,
                )
                char = f"{style}{char}{_RESET}" if style else char
            parts.append(char)
            if c % 3 == 2:
                parts.append("|")
        lines.append(" ".join(parts))
        if r % 3 == 2:
            lines.append(border)
    return "\n".join(lines)
