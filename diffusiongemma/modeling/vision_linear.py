"""The vision tower's clippable linears, made visible to PEFT as the linear layers they are.

Gemma 4's vision tower wraps each projection in `Gemma4ClippableLinear` (an `nn.Module` holding `.linear` and, with
`use_clipped_linears`, input/output clamps). Its projections are named `q_proj` ... `down_proj`, like the text stack's,
so the LoRA target list every Gemma recipe uses matches them too, and PEFT refuses the wrapper ("Target module
Gemma4ClippableLinear(...) is not supported"). `AdaptableClippableLinear` is the same module (same forward, same
`linear.weight` state-dict key) that also *is* an `nn.Linear` to `isinstance`, with `weight`, `bias`, `in_features`
and `out_features` read through to `.linear`: PEFT's LoRA then wraps it like any linear (the adapter adds
`B A x` to the clamped output; merging adds `B A` to `linear.weight`).
"""

import torch
from torch import nn
from transformers.models.gemma4.modeling_gemma4 import Gemma4ClippableLinear


class AdaptableClippableLinear(Gemma4ClippableLinear, nn.Linear):
    """`Gemma4ClippableLinear` that PEFT (and anything else asking `isinstance(m, nn.Linear)`) takes for a linear.

    It owns no parameter of its own: `weight` is `self.linear.weight`, so the state dict, loading and saving are the
    wrapper's (`...q_proj.linear.weight`). Only built by `make_vision_linears_adaptable`, from an existing wrapper.
    """

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> None:
        return None  # Gemma 4's vision linears have no bias

    @property
    def in_features(self) -> int:
        return self.linear.in_features

    @property
    def out_features(self) -> int:
        return self.linear.out_features

    forward = Gemma4ClippableLinear.forward
    extra_repr = nn.Module.extra_repr


def make_vision_linears_adaptable(tower: nn.Module) -> int:
    """Turn every `Gemma4ClippableLinear` of `tower` into an `AdaptableClippableLinear` in place; returns how many."""
    count = 0
    for module in tower.modules():
        if type(module) is Gemma4ClippableLinear:
            module.__class__ = AdaptableClippableLinear
            count += 1
    return count
