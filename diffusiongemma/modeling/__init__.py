from .cache import BlockDiffusionCache
from .config import DiffusionGemmaConfig, DiffusionGemmaTextConfig
from .model import DiffusionGemmaForBlockDiffusion, DiffusionGemmaOutput

__all__ = [
    "BlockDiffusionCache",
    "DiffusionGemmaConfig",
    "DiffusionGemmaTextConfig",
    "DiffusionGemmaForBlockDiffusion",
    "DiffusionGemmaOutput",
]
