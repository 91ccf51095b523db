"""Per-canvas denoising state, in one object.

Legend: B batch, L canvas length, V vocab, H hidden, S' committed tokens (prompt and canvases so far).
"""

from dataclasses import dataclass

import torch


@dataclass
class CanvasState:
    """Everything one lock-step denoising step reads and writes; `step.denoise_step` returns a new one.

    Attributes:
        canvas: [B, L] tokens fed to the next decoder pass (accepted samples + fresh noise).
        argmax_canvas: [B, L] argmax of the latest tempered logits; committed when the canvas ends.
        soft: [B, L, H] self-conditioning soft embedding of the latest tempered logits, None before the first step.
        finished_denoising: [B] bool, rows whose stopper fired (frozen until the canvas ends).
        forward_passes: [B] int32, denoising passes counted per row over the whole generation.
        steps_remaining: n of spec D.4.4, counting N..1 (the next step's temperature and `cur_step`).
        sequences: [B, S'] the committed tokens (what logits processors see); fixed for the canvas.
        finished_sequences: [B] bool, rows that finished their sequence before this canvas; fixed for the canvas.
        rows: fast mode: the rows that still denoise, host-side, in order (read once per step by the outer loop, so
            the step itself never reads the device); None in reference mode (every row runs).
        draft_logits: [B, L, V] tempered logits of the latest step, kept only for a streamer that takes logits.
        faults: [B] int8 fault codes of the latest step (generation/finite.py: NaN/Inf logits, or nothing to sample
            from): the loop raises instead of committing noise.
        entropy: [B, L] fp32 entropy of the latest tempered logits, as the sampler computed it (inf for rows fast
            mode did not run); read by trace recording (`diffusiongemma.accuracy`).
        accepted: [B, L] bool, the positions the sampler kept in the latest step (False for rows it did not run).
        stop_state: the stopper's per-row state (batch first), or None.
        sampler_state: a stateful sampler's per-row state (batch first, `Sampler.init_state`), or None.
        temperature: 0-d fp32, the latest step's temperature.
        prompt_width: P, the (padded) prompt's width in `sequences`.
    """

    canvas: torch.Tensor
    argmax_canvas: torch.Tensor
    soft: torch.Tensor | None
    finished_denoising: torch.Tensor
    forward_passes: torch.Tensor
    steps_remaining: int = 0
    sequences: torch.Tensor | None = None
    finished_sequences: torch.Tensor | None = None
    rows: list[int] | None = None
    draft_logits: torch.Tensor | None = None
    faults: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    accepted: torch.Tensor | None = None
    stop_state: torch.Tensor | None = None
    sampler_state: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    prompt_width: int = 0
