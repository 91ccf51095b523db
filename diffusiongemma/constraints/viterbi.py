"""The most probable canvas a token automaton accepts, given a denoising step's per-position scores (DINGO,
arXiv 2505.23061): a Viterbi pass over canvas positions x automaton states, vectorized in torch.

A path's score is the sum over positions of its tokens' log-probabilities. Every path picks one token at every
position, so each position's log-normalizer (and a temperature shared by the row) adds the same amount to every
path: the logits themselves rank paths exactly as the log-probabilities do, and no softmax is needed.

Work per canvas: one pass over the [B, L, V] logits for each class' best logit (`class_maxima`), L steps over the E
allowed (state, class) pairs, the walk back, and one more pass over the logits for the chosen classes' tokens
(`class_argmax`): O(B L V + B L E) time, [B, L, E] + [B, L, S] memory besides the logits.

Legend: B rows, L canvas length, V vocab, S automaton states, C token classes, E allowed (state, class) pairs,
R rows of a block.
"""

import torch

from .automaton import TokenAutomaton

NEG = -1e30  # stands in for -inf so that a forced path through a masked token still has a finite score
BLOCK_ELEMENTS = 1 << 22  # rows of logits handled at once in class_maxima: bounds its temporaries


def class_maxima(logits: torch.Tensor, automaton: TokenAutomaton) -> torch.Tensor:
    """logits [B, L, V] -> best [B, L, C] fp32: each class' highest logit at each position (-inf and NaN become a
    finite stand-in, so a path the constraint forces through a masked token still exists)."""
    B, L, V = logits.shape
    C = automaton.num_classes
    flat = logits.reshape(B * L, V)
    best = torch.empty(B * L, C, dtype=torch.float32, device=logits.device)
    rows = max(1, BLOCK_ELEMENTS // V)
    for r0 in range(0, B * L, rows):
        x = flat[r0 : r0 + rows].float()  # [R, V]
        top = x.new_full((x.shape[0], C), float("-inf")).scatter_reduce_(
            1, automaton.token_class.expand(x.shape[0], V), x, "amax")  # [R, C]
        best[r0 : r0 + rows] = top.nan_to_num_(nan=NEG).clamp_min_(NEG)
    return best.view(B, L, C)


def class_argmax(logits: torch.Tensor, automaton: TokenAutomaton, classes: torch.Tensor) -> torch.Tensor:
    """logits [B, L, V], classes [B, L] -> tokens [B, L]: at each position the most likely token of the class the
    path chose there (the lowest id on ties; any token of the class when all of its logits are -inf or NaN)."""
    B, L, V = logits.shape
    flat, wanted = logits.reshape(B * L, V), classes.reshape(B * L)
    tokens = torch.empty(B * L, dtype=torch.long, device=logits.device)
    rows = max(1, BLOCK_ELEMENTS // V)
    for r0 in range(0, B * L, rows):
        inside = automaton.token_class[None] == wanted[r0 : r0 + rows, None]  # [R, V]
        pick = flat[r0 : r0 + rows].float().masked_fill(~inside, float("-inf")).argmax(dim=-1)  # first maximum
        ok = inside.gather(1, pick[:, None])[:, 0]
        tokens[r0 : r0 + rows] = torch.where(ok, pick, automaton.class_token[wanted[r0 : r0 + rows]])
    return tokens.view(B, L)


def pack(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """fp32 values and int ids < 2**31 -> int64 keys that order as (value, id): the float's bits made monotone
    (negative floats have their magnitude bits flipped) in the high half, the id in the low half."""
    bits = values.contiguous().view(torch.int32)
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (key.to(torch.int64) << 32) | ids


def unpack(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack`: (fp32 values, int64 ids)."""
    key = (keys >> 32).to(torch.int32)
    bits = torch.where(key < 0, key ^ 0x7FFFFFFF, key)
    return bits.view(torch.float32), keys & 0xFFFFFFFF


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
    S, src, cls, dst = automaton.num_states, automaton.src, automaton.cls, automaton.dst
    E = src.shape[0]
    device = logits.device
    on_edge = class_maxima(logits, automaton).index_select(2, cls)  # [B, L, E] each edge's best logit per position
    edge_ids = torch.arange(E, device=device)
    score = torch.full((B, S), float("-inf"), device=device)  # [B, S] best path score into each state
    score.scatter_(1, start[:, None], 0.0)
    back = torch.empty(B, L, S, dtype=torch.long, device=device)  # [B, L, S] the best edge into each state
    into = dst.expand(B, E)
    unreached = pack(torch.full((B, S), float("-inf"), device=device), torch.zeros(B, S, dtype=torch.long,
                                                                                      device=device))
    for i in range(L):
        cand = score.index_select(1, src) + on_edge[:, i]  # [B, E]
        # one scatter gives both the best score into each state and its edge: (score, edge id) packed in int64
        best = unreached.clone().scatter_reduce_(1, into, pack(cand, edge_ids.expand(B, E)), "amax")  # [B, S]
        score, back[:, i] = unpack(best)
    final = score.masked_fill(~end_ok, float("-inf"))
    reached = final.amax(dim=-1) > float("-inf")
    final = torch.where(reached[:, None], final, score)  # no way into end_ok: the best reachable state
    state = final.argmax(dim=-1)  # [B]
    edges = torch.empty(B, L, dtype=torch.long, device=device)
    rows = torch.arange(B, device=device)
    for i in range(L - 1, -1, -1):  # walk the back-pointers from the end
        edges[:, i] = back[rows, i, state].clamp_min(0)  # [B]
        state = src[edges[:, i]]
    return class_argmax(logits, automaton, cls[edges]), src[edges], reached


def allowed_mask(automaton: TokenAutomaton, states: torch.Tensor) -> torch.Tensor:
    """states [B, L] -> [B, L, V] bool: the tokens allowed at each position given the state before it."""
    B, L = states.shape
    allowed = automaton.class_table[states] >= 0  # [B, L, C]
    return allowed.gather(2, automaton.token_class.expand(B, L, -1))
