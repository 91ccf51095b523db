"""The most probable canvas a token automaton accepts, given a denoising step's per-position scores (DINGO,
arXiv 2505.23061): a Viterbi pass over canvas positions x automaton states, vectorized in torch.

A path's score is the sum over positions of its tokens' log-probabilities. Every path picks one token at every
position, so each position's log-normalizer (and a temperature shared by the row) adds the same amount to every
path: the logits themselves rank paths exactly as the log-probabilities do, and no softmax is needed.

Work per canvas: one pass over the [B, L, V] logits for each class' best token (`class_maxima`), then L steps over
the E allowed (state, class) pairs: O(B L V + B L E) time, [B, L, C] + [B, L, S] memory.

Legend: B rows, L canvas length, V vocab, S automaton states, C token classes, E allowed (state, class) pairs,
R rows of a block.
"""

import torch

from .automaton import TokenAutomaton

NEG = -1e30  # stands in for -inf so that a forced path through a masked token still has a finite score
BLOCK_ELEMENTS = 1 << 22  # rows of logits handled at once in class_maxima: bounds its temporaries


def class_maxima(logits: torch.Tensor, automaton: TokenAutomaton) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, L, V] -> (best [B, L, C] fp32: each class' highest logit at each position, token [B, L, C] long:
    the token holding it; the lowest id on ties)."""
    B, L, V = logits.shape
    C = automaton.num_classes
    flat = logits.reshape(B * L, V)
    best = flat.new_empty(B * L, C, dtype=torch.float32)
    token = torch.empty(B * L, C, dtype=torch.long, device=logits.device)
    ids = torch.arange(V, device=logits.device)
    rows = max(1, BLOCK_ELEMENTS // V)
    for r0 in range(0, B * L, rows):
        x = flat[r0 : r0 + rows].float()  # [R, V]
        index = automaton.token_class.expand(x.shape[0], V)
        top = x.new_full((x.shape[0], C), float("-inf")).scatter_reduce_(1, index, x, "amax")  # [R, C]
        hit = x == top.gather(1, index)  # [R, V] the tokens holding their class' maximum
        pick = torch.where(hit, V - ids, 0)  # the lowest id wins the amax below
        first = torch.zeros(x.shape[0], C, dtype=torch.long, device=x.device).scatter_reduce_(1, index, pick, "amax")
        # a class whose logits are all -inf (or NaN) has no hit: take any of its tokens
        token[r0 : r0 + rows] = torch.where(first > 0, V - first, automaton.class_token[None])
        best[r0 : r0 + rows] = top.nan_to_num(nan=NEG).clamp_min(NEG)
    return best.view(B, L, C), token.view(B, L, C)


def constrained_path(logits: torch.Tensor, automaton: TokenAutomaton, start: torch.Tensor, end_ok: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The most probable token sequence the automaton accepts from each row's start state.

    Args:
        logits: [B, L, V] a denoising step's scores (any temperature: it does not change the ranking).
        automaton: the compiled constraint (on the logits' device).
        start: [B] long, each row's state before canvas position 0.
        end_ok: [B, S] bool, the states a row's canvas may end in (those from which the rest of the answer fits
            in the tokens left). A row with no path into them ends in the best state it can reach.

    Returns:
        tokens [B, L] long (a path the automaton accepts from `start`), states [B, L] long (the state before each
        position on that path), and reached [B] bool (the path ends in `end_ok`).
    """
    B, L, _ = logits.shape
    best, token = class_maxima(logits, automaton)  # [B, L, C] each
    S, src, cls, dst = automaton.num_states, automaton.src, automaton.cls, automaton.dst
    E = src.shape[0]
    device = logits.device
    edge_ids = torch.arange(E, device=device)
    score = torch.full((B, S), float("-inf"), device=device)  # [B, S] best path score into each state
    score.scatter_(1, start[:, None], 0.0)
    back = torch.empty(B, L, S, dtype=torch.long, device=device)  # [B, L, S] the best edge into each state
    into = dst.expand(B, E)
    for i in range(L):
        cand = score[:, src] + best[:, i, cls]  # [B, E]
        new = torch.full((B, S), float("-inf"), device=device).scatter_reduce_(1, into, cand, "amax")
        win = torch.where((cand == new[:, dst]) & (cand > float("-inf")), edge_ids, -1)  # [B, E]
        back[:, i] = torch.full((B, S), -1, dtype=torch.long, device=device).scatter_reduce_(1, into, win, "amax")
        score = new
    final = score.masked_fill(~end_ok, float("-inf"))
    reached = final.amax(dim=-1) > float("-inf")
    final = torch.where(reached[:, None], final, score)  # no way into end_ok: the best reachable state
    state = final.argmax(dim=-1)  # [B]
    tokens = torch.empty(B, L, dtype=torch.long, device=device)
    states = torch.empty(B, L, dtype=torch.long, device=device)
    rows = torch.arange(B, device=device)
    for i in range(L - 1, -1, -1):  # walk the back-pointers from the end
        edge = back[rows, i, state].clamp_min(0)  # [B]
        tokens[:, i] = token[rows, i, cls[edge]]
        state = src[edge]
        states[:, i] = state
    return tokens, states, reached


def allowed_mask(automaton: TokenAutomaton, states: torch.Tensor) -> torch.Tensor:
    """states [B, L] -> [B, L, V] bool: the tokens allowed at each position given the state before it."""
    B, L = states.shape
    allowed = automaton.class_table[states] >= 0  # [B, L, C]
    return allowed.gather(2, automaton.token_class.expand(B, L, -1))
