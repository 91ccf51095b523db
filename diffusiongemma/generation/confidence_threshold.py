"""Confidence threshold (mlx-vlm's default DiffusionGemma sampler; Fast-dLLM's parallel decoding): commit every
uncommitted position whose token probability reaches `threshold`, at least one per step while any is left; with
`factor`, Fast-dLLM's dynamic rule instead: ranked by probability, the n-th newly committed position (1-based) needs
probability >= 1 - factor / (n + 1). Committed positions are kept for the rest of the canvas; the others are
re-noised.

Example (factor 1.0): probabilities ranked 0.99, 0.8, 0.7 -> bars 0.5, 0.667, 0.75 -> the first two commit.

Legend: B rows, L canvas length, V vocab.
"""

import math
from dataclasses import asdict, dataclass

import torch

from .block_refinement import check_bool, check_probability
from .commit import CommitSampler, commit, descending_ranks, draft
from .entropy_bound import SoftEmbed, StepOutput


@dataclass
class ConfidenceThresholdSamplerConfig:
    """Settings of the confidence-threshold sampler.

    Args:
        threshold: commit every uncommitted position with token probability >= threshold (0 < threshold <= 1).
        factor: None, or a float > 0: use Fast-dLLM's dynamic rule (n-th commit needs >= 1 - factor / (n + 1))
            instead of the fixed threshold.
        greedy: draft the argmax token instead of sampling it.
    """

    threshold: float = 0.9
    factor: float | None = None
    greedy: bool = False

    def __post_init__(self):
        owner = type(self).__name__
        check_probability("threshold", self.threshold, owner)
        if self.factor is not None and (isinstance(self.factor, bool) or not isinstance(self.factor, float)
                                        or not math.isfinite(self.factor) or self.factor <= 0):
            raise ValueError(f"`{owner}.factor` must be None or a finite float > 0, got {self.factor!r}")
        check_bool("greedy", self.greedy, owner)

    def to_dict(self) -> dict:
        return {**asdict(self), "_cls_name": type(self).__name__}


def threshold_commits(committed: torch.Tensor, confidence: torch.Tensor, threshold: float,
                      factor: float | None) -> torch.Tensor:
    """The positions committed this step: [B, L] bool, never an already committed one; at least the most confident
    uncommitted position of every row that has one.

    committed [B, L] bool, confidence [B, L] fp32.
    """
    free = ~committed
    ranks = descending_ranks(confidence.masked_fill(committed, float("-inf")))  # 0 = most confident free position
    if factor is None:
        passes = confidence >= threshold
    else:
        bar = 1 - factor / (ranks.to(torch.float32) + 2)  # rank r is the (r + 1)-th commit: 1 - factor / (n + 1)
        # confidence falls and the bar rises along the ranking, so the positions that pass are a prefix of it
        passes = confidence >= bar
    return free & (passes | (ranks == 0))


class ConfidenceThresholdSampler(CommitSampler):
    """Confidence threshold drawing from one generator per row: per step and row L draws (unless greedy), then L
    noise tokens. `accepted` and `state` are the committed mask after the step."""

    per_row = True

    def __init__(self, config: ConfidenceThresholdSamplerConfig, context):
        self.threshold, self.factor, self.greedy = config.threshold, config.factor, config.greedy
        self.vocab_size = context.vocab_size

    def step(self, logits: torch.Tensor, canvas: torch.Tensor, temperature, step, generators,
             soft_embed: SoftEmbed | None = None, state: torch.Tensor | None = None) -> StepOutput:
        committed = self.committed(state, canvas)
        d = draft(logits, self.greedy, generators, soft_embed)  # RNG: the draft
        new = threshold_commits(committed, d.confidence, self.threshold, self.factor)
        canvas, committed = commit(canvas, committed, d.tokens, new, None, self.vocab_size, generators)  # RNG
        return StepOutput(canvas, d.argmax, committed, d.entropy, d.soft, committed, d.tokens)


class ConfidenceThresholdReferenceSampler(ConfidenceThresholdSampler):
    """Confidence threshold drawing from the global RNG over the whole batch (one multinomial, one randint)."""

    per_row = False
