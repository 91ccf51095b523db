"""The modules `DiffusionGemmaForBlockDiffusion` is assembled from, named as the checkpoint names them (spec B.1/B.2),
and its output type.

Legend: B batch, P prompt tokens, L canvas length, H hidden, V vocab.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModel
from transformers.utils import ModelOutput

from .blocks import RMSNorm
from .cache import BlockDiffusionCache
from .config import DiffusionGemmaConfig
from .stack import DiffusionGemmaTextStack
from .vision_linear import make_vision_linears_adaptable


@dataclass
class DiffusionGemmaOutput(ModelOutput):
    """Output of `DiffusionGemmaForBlockDiffusion.forward`.

    Attributes:
        loss: training loss when `labels` are given.
        logits: [B, L, V] fp32, soft-capped.
        past_key_values: the `BlockDiffusionCache` holding the committed prefix.
        hidden_states: decoder-mode hidden states per layer when `output_hidden_states=True`.
        encoder_last_hidden_state: [B, P, H] post-norm encoder output when `input_ids` were given.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    past_key_values: BlockDiffusionCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    encoder_last_hidden_state: torch.Tensor | None = None


class _ScalarHolder(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("layer_scalar", torch.ones(1))


class _EncoderScalars(nn.Module):
    """Holds `model.encoder.language_model.layers.i.layer_scalar`: the encoder-mode scalars are not tied (B.2)."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(_ScalarHolder() for _ in range(num_layers))


class MultimodalEmbedder(nn.Module):
    """Vision soft tokens -> text space: weightless RMSNorm then a projection (spec C.11)."""

    def __init__(self, vision_hidden: int, text_hidden: int, eps: float):
        super().__init__()
        self.embedding_pre_projection_norm = RMSNorm(vision_hidden, eps, with_scale=False)
        self.embedding_projection = nn.Linear(vision_hidden, text_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embedding_projection(self.embedding_pre_projection_norm(x))


class DiffusionGemmaEncoderParts(nn.Module):
    """What only encoder mode has: the vision tower, its projector and the encoder-mode layer scalars.

    A text-only config (`vision_config` None, e.g. `diffusiongemma convert orbax --text-only`) has neither tower nor
    projector (both attributes None).
    """

    def __init__(self, config: DiffusionGemmaConfig):
        super().__init__()
        self.language_model = _EncoderScalars(config.text_config.num_hidden_layers)
        if config.vision_config is None:
            self.vision_tower = self.embed_vision = None
            return
        self.vision_tower = AutoModel.from_config(config.vision_config)
        make_vision_linears_adaptable(self.vision_tower)  # PEFT's LoRA takes them (modeling/vision_linear.py)
        vision_hidden = getattr(config.vision_config, "output_proj_dims", config.vision_config.hidden_size)
        self.embed_vision = MultimodalEmbedder(
            vision_hidden, config.text_config.hidden_size, config.vision_config.rms_norm_eps
        )

    def layer_scalars(self) -> list[torch.Tensor]:
        return [holder.layer_scalar for holder in self.language_model.layers]


class DiffusionGemmaModel(nn.Module):
    """Container giving the checkpoint's `model.` prefix its two children."""

    def __init__(self, config: DiffusionGemmaConfig):
        super().__init__()
        self.decoder = DiffusionGemmaTextStack(config.text_config)
        self.encoder = DiffusionGemmaEncoderParts(config)
