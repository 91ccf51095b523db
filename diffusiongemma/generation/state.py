"""Per-canvas denoising state, in one object.

Legend: B batch, L canvas length, H hidden.
"""

from dataclasses import dataclass

import torch


@dataclass
class CanvasState:
    """Everything one denoising step reads and writes.

    Attributes:
        canvas: [B, L] tokens fed to the next decoder pass (accepted samples + fresh noise).
        argmax_canvas: [B, L] argmax of the latest tempered logits; committed when the canvas ends.
        soft: [B, L, H] self-conditioning soft embedding of the latest tempered logits, None before the first step.
        finished_denoising: [B] bool, rows whose stopper fired (frozen until the canvas ends).
        forward_passes: [B] int32, denoising passes counted per row over the whole generation.
    """

    canvas: torch.Tensor
    argmax_canvas: torch.Tensor
    soft: torch.Tensor | None
    finished_denoising: torch.Tensor
    forward_passes: torch.Tensor
