"""Non-finite logits: detected on the device once per step, reported on the host with the step, canvas and cause.

A NaN or +inf score (a NaN weight, a broken FP8 scale, a logits processor writing NaN) would make the fast sampler
commit noise or padding without a word, and the reference sampler fail with torch's bare "probability tensor contains
either inf, nan or element < 0". Each step instead computes one [B] fault code per row on the device; the loop reads
it in the same host copy as the stop flags, so the check adds no synchronisation.

Codes: 0 fine; 1 the model's logits hold NaN or +-inf; 2 the logits processors turned finite logits into NaN or +inf;
3 every token is -inf (the processors banned the whole vocabulary), so there is nothing to sample.

Legend: B batch, B' rows that run, L canvas length, V vocab.
"""

import torch

FINE, MODEL, PROCESSORS, EMPTY = 0, 1, 2, 3

__all__ = ["NonFiniteLogitsError", "fault_codes", "raise_for_faults", "model_logits_bad", "processed_scores_bad"]


class NonFiniteLogitsError(ValueError):
    """The logits of some rows could not be sampled from. Attributes: rows, step (1-based), canvas (0-based) and
    cause ("model", "processors" or "empty")."""

    def __init__(self, rows: list[int], step: int, canvas: int | None, cause: str):
        self.rows, self.step, self.canvas, self.cause = rows, step, canvas, cause
        where = f"denoising step {step}" + (f" of canvas {canvas}" if canvas is not None else "")
        if cause == "model":
            why = ("the model's logits hold NaN or Inf: a weight, a quantization scale or an activation is not "
                   "finite (check the checkpoint; try float32)")
        elif cause == "processors":
            why = "the model's logits were finite, but the `logits_processor`s produced NaN or +inf scores"
        else:
            why = ("every token's score is -inf after the `logits_processor`s (a processor banned the whole "
                   "vocabulary?), so there is nothing to sample")
        super().__init__(f"non-finite logits at {where}, batch rows {rows}: {why}")

    def at_canvas(self, canvas: int) -> "NonFiniteLogitsError":
        """The same error, naming the canvas (the step does not know which canvas it denoises)."""
        return NonFiniteLogitsError(self.rows, self.step, canvas, self.cause)


def model_logits_bad(logits: torch.Tensor) -> torch.Tensor:
    """[B', L, V] -> [B'] bool: the row holds a NaN or an infinity (the LM head never yields -inf legitimately).

    One sum over the vocabulary: a NaN or an infinity anywhere makes the sum NaN or infinite. It is a single
    memory-bound pass with no [B', L, V] temporary (`isfinite` builds one from `abs`; `aminmax` is ten times slower
    on CPU). A sum of finite fp32 logits overflows only if they average above ~1e33 in size, which no LM head produces
    (with softcapping they are bounded by the cap), so it never fires on sane logits."""
    return ~logits.sum(dim=-1).isfinite().all(dim=-1)  # [B', L] -> [B']


def processed_scores_bad(scores, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    """What the logits processors returned, [B', L, V] -> ([B'] bool: a NaN or +inf score; [B'] bool: some position
    has every token at -inf), from one max over the vocabulary (a NaN propagates through it).

    Raises:
        TypeError / ValueError: the processors returned no tensor, or one of another shape than the `shape` given.
    """
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"a `logits_processor` returned {type(scores).__name__} instead of the scores tensor: a "
                        "processor must return the (possibly modified) scores")
    if scores.shape != shape:
        raise ValueError(f"a `logits_processor` returned scores of shape {list(scores.shape)}, expected "
                         f"{list(shape)} (the shape it was given)")
    if not scores.dtype.is_floating_point:
        raise ValueError(f"a `logits_processor` returned scores of dtype {scores.dtype}, expected a float tensor")
    top = scores.amax(dim=-1)  # [B', L]
    return (top.isnan() | top.isposinf()).any(dim=-1), top.isneginf().any(dim=-1)


def fault_codes(model_bad: torch.Tensor, processors_bad: torch.Tensor | None, empty: torch.Tensor) -> torch.Tensor:
    """[B'] bool flags -> [B'] int8 codes (module docstring); the model's fault wins over the processors'."""
    code = torch.where(empty, EMPTY, FINE)
    if processors_bad is not None:
        code = torch.where(processors_bad, PROCESSORS, code)
    return torch.where(model_bad, MODEL, code).to(torch.int8)


def raise_for_faults(codes: list[int], step: int, canvas: int | None, rows: list[int] | None = None) -> None:
    """Raise `NonFiniteLogitsError` for the worst fault among host-side `codes` (row i is `rows[i]` if given)."""
    if not any(codes):
        return
    names = rows if rows is not None else list(range(len(codes)))
    for code, cause in ((MODEL, "model"), (PROCESSORS, "processors"), (EMPTY, "empty")):
        bad = [names[i] for i, c in enumerate(codes) if c == code]
        if bad:
            raise NonFiniteLogitsError(bad, step, canvas, cause)
