"""What the commit-style samplers share (block refinement, confidence threshold): a draft of every position, and
the commit that keeps committed positions and re-noises the others.

In uniform corruption there is no mask token, so which positions are committed is state: a [B, L] bool mask, made
fresh at the start of a canvas (`init_state`) and handed from step to step by the engine (`StepOutput.state`).

Legend: B rows, L canvas length, V vocab, N = B*L positions, H hidden.
"""

from typing import NamedTuple

import torch

from .draws import Generators, categorical, random_tokens
from .entropy_bound import SoftEmbed, blocked_rows, first_argmax, row_block, token_entropy


class Draft(NamedTuple):
    """A proposal for every position of the canvas, from the tempered logits of one step."""

    tokens: torch.Tensor  # [B, L] long: sampled (or greedy) tokens
    confidence: torch.Tensor  # [B, L] fp32: each token's probability
    argmax: torch.Tensor  # [B, L] long: argmax of the logits (committed when the canvas ends)
    entropy: torch.Tensor  # [B, L] fp32 (the stopper, traces)
    soft: torch.Tensor | None  # [B, L, H] self-conditioning input from the same probabilities, or None


def draft(logits: torch.Tensor, greedy: bool, generators: Generators, soft_embed: SoftEmbed | None) -> Draft:
    """Tokens and their probabilities under softmax(logits [B, L, V]) (fp32, already divided by the temperature).

    greedy: the first argmax and its probability (no draw); else one categorical draw per position (RNG: one
    multinomial over B*L rows, or L rows per row generator). The logits are left untouched.
    """
    B, L, V = logits.shape
    flat = logits.view(B * L, V)
    block = row_block(V)
    argmax = blocked_rows(first_argmax, flat, block).view(B, L)
    entropy = blocked_rows(token_entropy, flat, block).view(B, L)
    probs = torch.softmax(logits, dim=-1)  # [B, L, V] fp32
    tokens = argmax if greedy else categorical(probs, generators)
    confidence = probs.gather(-1, tokens[..., None])[..., 0]  # [B, L]
    soft = soft_embed(probs) if soft_embed is not None else None
    return Draft(tokens, confidence, argmax, entropy, soft)


def commit(canvas: torch.Tensor, committed: torch.Tensor, tokens: torch.Tensor, new: torch.Tensor,
           edits: torch.Tensor | None, vocab_size: int, generators: Generators) -> tuple[torch.Tensor, torch.Tensor]:
    """The next canvas and committed mask.

    Newly committed positions (`new`) and edited committed positions (`edits`) take the drafted token; the other
    committed positions keep the canvas the decoder read; every uncommitted position gets fresh uniform noise (RNG:
    B*L ints, drawn every step, after the draft).
    canvas, tokens [B, L] long; committed, new, edits [B, L] bool -> (canvas [B, L], committed [B, L]).
    """
    take = new if edits is None else new | edits
    kept = torch.where(take, tokens, canvas)
    committed = committed | new
    noise = random_tokens(vocab_size, tuple(canvas.shape), canvas.device, generators)
    return torch.where(committed, kept, noise), committed


def fresh_commits(batch: int, length: int, device: torch.device) -> torch.Tensor:
    """Nothing committed yet: [B, L] bool, all False (the start of every canvas)."""
    return torch.zeros(batch, length, dtype=torch.bool, device=device)


def descending_ranks(confidence: torch.Tensor) -> torch.Tensor:
    """Each position's rank in its row, most confident first: confidence [B, L] -> ranks [B, L] long (0 = top).

    The order is `torch.sort(descending=True)`'s (ties as that kernel leaves them, the same as argsort's, so the
    ranks equal diffusers' argsort().argsort()).
    """
    order = torch.sort(confidence, dim=-1, descending=True).indices  # [B, L]
    positions = torch.arange(confidence.shape[-1], device=confidence.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, positions)


class CommitSampler:
    """The part of a commit-style sampler that is the same for all of them: a uniform noise canvas to start from, a
    fresh committed mask per canvas, and that mask taken back from the engine each step (`state`). Subclasses set
    `vocab_size` and write `step`."""

    vocab_size: int

    def init_canvas(self, batch: int, length: int, device: torch.device, generators) -> torch.Tensor:
        return random_tokens(self.vocab_size, (batch, length), device, generators)  # RNG: canvas init

    def init_state(self, batch: int, length: int, device: torch.device) -> torch.Tensor:
        return fresh_commits(batch, length, device)

    @staticmethod
    def committed(state: torch.Tensor | None, canvas: torch.Tensor) -> torch.Tensor:
        """The committed mask [B, L] the step starts from: the engine's state, or a fresh one without it."""
        return state if state is not None else fresh_commits(*canvas.shape, canvas.device)
