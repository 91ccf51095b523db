"""What a streamed draft carries (docs/serving.md, "Draft streaming"): the request fields that ask for drafts, the
per-position confidence, and the SSE fields a draft adds to a chunk.

Three request fields turn the draft chunks on; each needs `"stream": true`:
- `stream_drafts`: the `draft` object (`text`, `canvas`, `step`, `provisional`);
- `draft_confidence`: the `draft` object also carries every canvas position's token and confidence (what the
  playground page draws);
- `diffusion_frame`: the chunk also carries the top-level `type: "diffusion_frame"`, `block`, `step`, `total` and
  `text` that Unsloth Studio's front end reads from its DiffusionGemma server.

Confidence of a position = 1 - H / ln V, H the entropy (nats) of the position's tempered distribution at this step
(the entropy the sampler and the stopper already computed), V the vocabulary size: 1 for a one-hot distribution, 0
for a uniform one.

Legend: L canvas length, V vocab.
"""

import json
import math
from dataclasses import dataclass

import torch

DRAFT_FIELDS = ("stream_drafts", "draft_confidence", "diffusion_frame")
CONFIDENCE_DIGITS = 4  # rounding on the wire: enough for a colour scale, a quarter of the JSON of full floats


@dataclass(frozen=True)
class DraftOptions:
    """Which draft fields a request asked for."""

    drafts: bool = False  # any draft chunks at all
    confidence: bool = False  # `draft.tokens`, `draft.confidence`, `draft.budget`, `draft.max_steps`
    frame: bool = False  # the top-level `diffusion_frame` fields


def draft_options(present: dict, per_row_sampler: bool, bad_field) -> DraftOptions:
    """Read the draft fields of a request body (None values already dropped).

    Args:
        present: the body's fields.
        per_row_sampler: the request runs in the row pool (a global-RNG sampler runs through `model.generate`,
            whose drafts carry no entropy).
        bad_field: the exception class to raise, called as `bad_field(field, message)`.
    """
    asked = {}
    for name in DRAFT_FIELDS:
        value = present.get(name, False)
        if not isinstance(value, bool):
            raise bad_field(name, f"must be true or false, got {value!r}")
        asked[name] = value
    for name in DRAFT_FIELDS:  # a non-streaming response has nowhere to put them: refused, never dropped
        if asked[name] and present.get("stream") is not True:
            raise bad_field(name, "drafts travel in a stream: send it with `stream: true`")
    if asked["draft_confidence"] and not per_row_sampler:
        raise bad_field("draft_confidence", f"per-position confidence streams from the row pool; sampling="
                                            f"{present.get('sampling')!r} runs alone through `model.generate`, "
                                            "whose drafts carry the argmax canvas only")
    return DraftOptions(drafts=any(asked.values()), confidence=asked["draft_confidence"],
                        frame=asked["diffusion_frame"])


def draft_confidence(entropy: torch.Tensor, vocab_size: int) -> list[float]:
    """entropy [1, L] or [L] (nats) -> L confidences 1 - H / ln V in [0, 1], rounded for the wire."""
    confidence = (1 - entropy.reshape(-1).float() / math.log(vocab_size)).clamp_(0, 1)
    return [round(c, CONFIDENCE_DIGITS) for c in confidence.tolist()]


class DraftText(str):
    """Provisional text of the canvas being denoised (the argmax canvas after a step), with what the request asked
    to stream beside it. `canvas` counts the canvases committed before it, `step` the denoising steps of this canvas
    so far (from 1); `detail` holds the extra `draft` fields (`draft_confidence`), or None; `total` is the request's
    `max_denoising_steps` and `frame` whether the chunk carries the `diffusion_frame` fields."""

    canvas: int
    step: int
    detail: dict | None
    total: int
    frame: bool

    def __new__(cls, text: str, canvas: int, step: int, detail: dict | None = None, total: int = 0,
                frame: bool = False):
        draft = super().__new__(cls, text)
        draft.canvas, draft.step, draft.detail, draft.total, draft.frame = canvas, step, detail, total, frame
        return draft


def draft_field(draft: DraftText) -> dict:
    """The documented `draft` field of a chunk (docs/serving.md)."""
    field = {"text": str(draft), "canvas": draft.canvas, "step": draft.step, "provisional": True}
    if draft.detail is not None:
        field.update(draft.detail)
    return field


def with_draft(sse: str, draft: DraftText) -> str:
    """Add the `draft` field (and, when asked, the `diffusion_frame` fields) to one SSE `data: {...}` event."""
    payload = json.loads(sse.removeprefix("data: "))
    payload["draft"] = draft_field(draft)
    if draft.frame:
        payload.update({"type": "diffusion_frame", "block": draft.canvas, "step": draft.step, "total": draft.total,
                        "text": str(draft)})
    return f"data: {json.dumps(payload)}\n\n"
