"""A constraint inside `generate` and the server: each row's automaton state, carried from the end of its prompt
across its canvases, and the step's projection onto the constraint.

The engine (`generation/engine.py`) calls `ConstraintGuide.project` every denoising step, after the processors and
the temperature: the row's argmax canvas, which the stopper reads and the commit keeps, becomes the most probable
canvas the automaton accepts from the row's state (viterbi.py), cut short where that canvas would need a token the
logits processors banned (`cut_at_bans`). With `project_canvas` the logits are also masked to
the tokens that path allows at each position (its state before each position), so what the sampler draws, the
self-conditioning input and the entropies the stopper reads all stay inside the constraint. That is off by default:
on the Sudoku model it solved fewer puzzles in more steps (benchmarks/sudoku_constraints.py, docs/constraints.md).

A row's state is found from what it committed: the guide remembers, per row, the state at its last canvas start
and walks the tokens committed since (on the device, no host read). Rows are known by `row_ids` and located by
`position_offsets` (the engine's processor arguments), so lock-step, the row pool and the server share this code.

Legend: B' rows of a step, L canvas length, V vocab, S automaton states.
"""

from dataclasses import dataclass, field

import torch

from .automaton import TokenAutomaton
from .viterbi import allowed_mask, constrained_path


@dataclass
class RowState:
    first: int  # position of the row's first generated token (its prompt length)
    at: int  # position of the canvas `state` is the state before
    state: torch.Tensor  # 0-d long on the device


@dataclass(eq=False)
class ConstraintGuide:
    """One call's (or one request's) constraint state.

    Args:
        automaton: the compiled constraint.
        canvas_length: L.
        max_new_tokens: each row's budget: its answer ends within this many tokens, then only padding follows
            (in the last canvas, positions past the budget prefer pad).
        project_canvas: also mask the step's logits to the best path's allowed tokens (see the module doc; off:
            only the argmax canvas, which the stopper reads and the commit keeps, is projected).
    """

    automaton: TokenAutomaton
    canvas_length: int
    max_new_tokens: int
    project_canvas: bool = False
    rows: dict = field(default_factory=dict)  # row id -> RowState

    def start_states(self, sequences, row_ids: list, position_offsets: list[int], device) -> torch.Tensor:
        """[B'] long: each row's state before its current canvas, walking what it committed since last seen."""
        automaton = self.automaton
        states = []
        for j, (row, offset) in enumerate(zip(row_ids, position_offsets)):
            known = self.rows.get(row)
            if known is None or offset < known.at:  # a new row (or a row id reused by a new sequence)
                known = RowState(first=offset, at=offset,
                                 state=torch.tensor(automaton.initial, dtype=torch.long, device=device))
                self.rows[row] = known
            elif offset > known.at:
                seen = sequences[j] if isinstance(sequences, list) else sequences[j]
                new = seen[-(offset - known.at):][None]  # [1, offset - at] the tokens committed since
                state = automaton.walk(known.state[None], new)[0]
                # a row cut short outside the constraint (a user's stopping criterion) only pads from here on
                known.state = torch.where(state < 0, automaton.done, state)
                known.at = offset
            states.append(known.state)
        return torch.stack(states)

    def tokens_left(self, row_ids: list, position_offsets: list[int]) -> list[int]:
        """Each row's budget at the start of its current canvas (tokens it may still generate)."""
        return [self.rows[r].first + self.max_new_tokens - o for r, o in zip(row_ids, position_offsets)]

    def forget(self, row_id) -> None:
        """Drop a finished row's state (the server's rows come and go)."""
        self.rows.pop(row_id, None)

    def project(self, logits: torch.Tensor, sequences, row_ids: list, position_offsets: list[int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B', L, V] (after processors and temperature) -> (logits, masked in place with `project_canvas`;
        path [B', L], the argmax canvas the constraint accepts)."""
        automaton = self.automaton.to(logits.device)
        self.automaton = automaton
        L = logits.shape[1]
        start = self.start_states(sequences, row_ids, position_offsets, logits.device)  # [B']
        left = self.tokens_left(row_ids, position_offsets)  # host ints
        after = torch.tensor([max(n - L, 0) for n in left], device=logits.device)  # [B'] budget after this canvas
        end_ok = automaton.distance[None] <= after[:, None]  # [B', S] the rest of the answer still fits
        scores = logits
        if min(left) < L and automaton.pad_id is not None:  # past the budget only pad (at any cost otherwise)
            past = torch.arange(L, device=logits.device)[None] >= torch.tensor(left, device=logits.device)[:, None]
            scores = logits.masked_fill(past[:, :, None], float("-inf"))  # [B', L, V]
            scores[:, :, automaton.pad_id] = torch.where(past, 0.0, logits[:, :, automaton.pad_id])
        path, states, _ = constrained_path(scores, automaton, start, end_ok)
        del scores
        path = cut_at_bans(logits, path, left, automaton.pad_id)
        if self.project_canvas:
            logits.masked_fill_(~allowed_mask(automaton, states), float("-inf"))
        return logits, path

    def complete(self, answers: torch.Tensor) -> torch.Tensor:
        """answers [B, N] generated tokens (pad after EOS) -> [B] bool: each is a whole answer of the constraint."""
        automaton = self.automaton.to(answers.device)
        start = torch.full((answers.shape[0],), automaton.initial, dtype=torch.long, device=answers.device)
        return automaton.complete(automaton.walk(start, answers))


def cut_at_bans(logits: torch.Tensor, path: torch.Tensor, left: list[int], pad_id: int | None) -> torch.Tensor:
    """logits [B', L, V], path [B', L] -> the path, padded from the first position within the budget whose token
    the processors banned (-inf or NaN) on.

    The Viterbi pass scores a banned token as a very low finite number, so it takes one only where the constraint
    leaves no other way: where the processors ban everything the constraint allows. The constraint must not bring a
    banned token back: the answer stops there instead, incomplete, and the final check says why
    (answer_check.py)."""
    if pad_id is None:
        return path
    L = path.shape[1]
    chosen = logits.gather(2, path[:, :, None])[..., 0]  # [B', L]
    within = torch.arange(L, device=path.device)[None] < torch.tensor(left, device=path.device)[:, None]
    banned = (chosen.isneginf() | chosen.isnan()) & within & (path != pad_id)  # [B', L]
    return path.masked_fill(banned.cumsum(dim=1) > 0, pad_id)
