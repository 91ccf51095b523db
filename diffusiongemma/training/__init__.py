"""Training: the block-diffusion objective, multi-canvas responses, the data collator (see docs/training.md)."""

from .canvases import CanvasNoise, draw_canvas_noise, multi_canvas_loss, per_canvas_loss
from .collator import DiffusionGemmaDataCollator, RowError
from .freeze import freeze_router
from .loss import BlockDiffusionLossOutput, block_diffusion_loss, corrupt_canvas, sample_noise_level

__all__ = ["BlockDiffusionLossOutput", "CanvasNoise", "DiffusionGemmaDataCollator", "RowError", "block_diffusion_loss", "corrupt_canvas", "draw_canvas_noise",
           "freeze_router", "multi_canvas_loss", "per_canvas_loss", "sample_noise_level"]
