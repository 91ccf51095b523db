"""What `generate` returns (spec D.6).

Legend: B batch, P prompt, L canvas length, c committed canvases.
"""

from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput


@dataclass
class DiffusionGemmaGenerationOutput(ModelOutput):
    """Result of `generate` with `return_dict_in_generate=True`.

    Attributes:
        sequences: [B, P + c*L] prompt followed by the committed canvases (pad after EOS).
        tokens_per_forward: [B] float, new non-pad tokens per denoising pass of that row.
        past_key_values: the cache; holds the prompt and every canvas but the last (spec D.6). Lock-step only.
        trace: with `return_trace=True`, a `diffusiongemma.accuracy.Trace` of every canvas and step.
        truncated: with a `constraint`, [B] bool: True where `max_new_tokens` ran out before the answer was complete
            (the tokens then are a prefix of a valid answer, never presented as a whole one), or where the answer's
            decoded text failed the final check (a bug of ours); None without one.
        truncation_reasons: with a `constraint`, [B] why each truncated row is not a whole answer (the budget ran
            out, a logits processor banned what the constraint needed, or the failed check), None where complete.
    """

    sequences: torch.LongTensor | None = None
    tokens_per_forward: torch.Tensor | None = None
    past_key_values: object | None = None
    logits: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    trace: object | None = None
    truncated: torch.Tensor | None = None
    truncation_reasons: list | None = None


def tokens_per_forward(new_tokens: torch.Tensor, passes: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """[B]: new tokens that are not pad (all of them without a pad id) per denoising pass (pitfall H.14)."""
    valid = (new_tokens != pad_id).sum(dim=-1) if pad_id is not None else new_tokens.shape[1]
    return valid / passes


def generation_output(config, sequences: torch.Tensor, prompt_length: int, passes: torch.Tensor, cache=None,
                      trace=None):
    """The sequences [B, P + c*L], or with `return_dict_in_generate` (or a trace) a `DiffusionGemmaGenerationOutput`."""
    if not config.return_dict_in_generate and trace is None:
        return sequences
    return DiffusionGemmaGenerationOutput(
        sequences=sequences,
        tokens_per_forward=tokens_per_forward(sequences[:, prompt_length:], passes, config.pad_token_id),
        past_key_values=cache,
        trace=trace,
    )
