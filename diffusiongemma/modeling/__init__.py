"""The network: one text stack run in encoder and decoder mode, its cache, masks, MoE and vision tower. The public
class that joins it with `generate`, the loss and loading is `diffusiongemma.model.DiffusionGemmaForBlockDiffusion`."""

from .cache import BlockDiffusionCache
from .config import DiffusionGemmaConfig, DiffusionGemmaTextConfig
from .parts import DiffusionGemmaOutput

__all__ = [
    "BlockDiffusionCache",
    "DiffusionGemmaConfig",
    "DiffusionGemmaTextConfig",
    "DiffusionGemmaOutput",
]
