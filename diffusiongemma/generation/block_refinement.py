"""Block refinement (diffusers' `BlockRefinementScheduler` in uniform-corruption mode, `mask_token_id=None`):
committed positions are kept for the rest of the canvas; each step commits what an even per-step quota still owes,
plus every uncommitted position whose token probability exceeds `threshold`; optionally a committed position is
edited when the model now proposes another token with probability above `editing_threshold`. The rest is re-noised.

Quota: after step s (0-based) of N, ceil((s + 1) * L / N) positions are committed, so the canvas is fully committed
by the last step. Example: L = 16, N = 6 -> targets 3, 6, 8, 11, 14, 16.

Legend: B rows, L canvas length, V vocab, N denoising steps per canvas.
"""

import math
from dataclasses import asdict, dataclass

import torch

from ..modeling.host import device_tensor
from .commit import CommitSampler, commit, descending_ranks, draft
from .entropy_bound import SoftEmbed, StepOutput


@dataclass
class BlockRefinementSamplerConfig:
    """Settings of the block-refinement sampler (diffusers' `BlockRefinementScheduler`, uniform corruption).

    Args:
        threshold: commit, beyond the quota, every uncommitted position whose token probability is > threshold
            (0 < threshold <= 1; 1.0 commits the quota only).
        editing_threshold: None (no editing) or a probability in (0, 1]: a committed position whose newly drafted
            token differs and has probability > editing_threshold takes it.
        greedy: draft the argmax token (diffusers' `temperature=0`) instead of sampling it.
    """

    threshold: float = 0.95
    editing_threshold: float | None = None
    greedy: bool = False

    def __post_init__(self):
        check_probability("threshold", self.threshold, type(self).__name__)
        if self.editing_threshold is not None:
            check_probability("editing_threshold", self.editing_threshold, type(self).__name__)
        check_bool("greedy", self.greedy, type(self).__name__)

    def to_dict(self) -> dict:
        return {**asdict(self), "_cls_name": type(self).__name__}


def check_probability(name: str, value, owner: str) -> None:
    """A probability setting in (0, 1]; ints are refused so JSON round-trips keep the type."""
    if isinstance(value, bool) or not isinstance(value, float) or not math.isfinite(value) or not 0 < value <= 1:
        raise ValueError(f"`{owner}.{name}` must be a float in (0, 1], got {value!r}")


def check_bool(name: str, value, owner: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"`{owner}.{name}` must be true or false, got {value!r}")


def quota_commits(committed: torch.Tensor, confidence: torch.Tensor, step: list[int], max_steps: int,
                  threshold: float) -> torch.Tensor:
    """The positions block refinement commits this step: [B, L] bool, never an already committed one.

    committed [B, L] bool, confidence [B, L] fp32, step: each row's 0-based step index. Positions owed by the
    quota go in descending confidence; any position above `threshold` is added.
    """
    B, L = committed.shape
    if all(s == step[0] for s in step):  # lock-step: one host int, no host-to-device copy
        target = ((step[0] + 1) * L + max_steps - 1) // max_steps  # ceil(done * L / N)
    else:  # the row pool: each row at its own step
        done = device_tensor(step, torch.long, committed.device) + 1  # [B] steps done after this one (async copy)
        target = (done * L + max_steps - 1) // max_steps  # [B]
    owed = (target - committed.sum(dim=-1)).clamp(min=0)  # [B]
    ranks = descending_ranks(confidence.masked_fill(committed, float("-inf")))  # committed ones rank last
    return ~committed & ((ranks < owed[:, None]) | (confidence > threshold))


class BlockRefinementSampler(CommitSampler):
    """Block refinement drawing from one generator per row (row b equals diffusers' scheduler run on row b alone with
    generators[b]). Per step and row: L draws (unless greedy), then L noise tokens.

    `accepted` is the committed mask after the step (the positions not re-noised); `state` the same mask.
    """

    per_row = True

    def __init__(self, config: BlockRefinementSamplerConfig, context):
        self.threshold, self.editing_threshold, self.greedy = config.threshold, config.editing_threshold, config.greedy
        self.vocab_size, self.max_steps = context.vocab_size, context.max_steps

    def step(self, logits: torch.Tensor, canvas: torch.Tensor, temperature, step, generators,
             soft_embed: SoftEmbed | None = None, state: torch.Tensor | None = None) -> StepOutput:
        committed = self.committed(state, canvas)
        d = draft(logits, self.greedy, generators, soft_embed)  # RNG: the draft
        new = quota_commits(committed, d.confidence, list(step), self.max_steps, self.threshold)
        edits = None
        if self.editing_threshold is not None:
            edits = committed & (d.tokens != canvas) & (d.confidence > self.editing_threshold)
        canvas, committed = commit(canvas, committed, d.tokens, new, edits, self.vocab_size, generators)  # RNG
        return StepOutput(canvas, d.argmax, committed, d.entropy, d.soft, committed, d.tokens)


class BlockRefinementReferenceSampler(BlockRefinementSampler):
    """Block refinement drawing from the global RNG over the whole batch, in diffusers' order (diffusers'
    `generator=None`): per step one multinomial over B*L rows (unless greedy), then one randint(B, L)."""

    per_row = False
