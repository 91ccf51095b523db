"""Training: the block-diffusion objective and helpers (see docs/training.md)."""

from .freeze import freeze_router
from .loss import BlockDiffusionLossOutput, block_diffusion_loss, corrupt_canvas, sample_noise_level

__all__ = ["BlockDiffusionLossOutput", "block_diffusion_loss", "corrupt_canvas", "freeze_router", "sample_noise_level"]
