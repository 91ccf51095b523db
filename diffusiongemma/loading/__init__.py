"""Loading and saving checkpoints, in one place: `pretrained.py` is the entry point (`from_pretrained`,
`save_pretrained`), `compressed.py` the compressed-tensors loader, `offload.py` device maps and CPU/disk offload,
`bnb.py` bitsandbytes defaults, `pipeline.py` the guard against `pipeline()`'s silent fallback. The table of
checkpoint weight names is the network's (`modeling/weights.py`)."""

from .pipeline import PipelineLoadError
from .pretrained import generation_config_for, load_pretrained, save_atomically

__all__ = ["PipelineLoadError", "generation_config_for", "load_pretrained", "save_atomically"]
