"""Random irregular tiny configs for the parity sweeps, and the built-in model to compare each one with.

See tests/parity/test_random_sweep.py for what is drawn and why the reference is sometimes adjusted.
"""

import random

import torch
from transformers import DiffusionGemmaConfig
from transformers import DiffusionGemmaForBlockDiffusion as BuiltinModel

from conftest import VISION


def random_config(seed: int) -> tuple[DiffusionGemmaConfig, dict]:
    """One irregular tiny config, and the prompt/canvas sizes to test it with."""
    r = random.Random(seed)
    heads = r.choice([2, 3, 4, 6])
    kv_heads = r.choice([d for d in (1, 2, 3, heads) if heads % d == 0])
    layers = r.randint(2, 9)
    layer_types = [r.choice(["sliding_attention", "full_attention", "sliding_attention"]) for _ in range(layers)]
    layer_types[-1] = "full_attention"  # the architecture requires it
    if layers >= 4 and layer_types.count("full_attention") < 2:
        layer_types[r.randrange(layers - 1)] = "full_attention"
    experts = r.randint(2, 9)
    text = dict(
        vocab_size=r.randint(40, 160),
        hidden_size=r.choice([4 * r.randint(5, 20), 8 * r.randint(3, 10)]),  # 20..80, mostly not multiples of 16
        intermediate_size=r.randint(9, 97),
        num_hidden_layers=layers,
        layer_types=layer_types,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=r.choice([4, 8, 12, 20, 24]),
        global_head_dim=r.choice([8, 12, 20, 28]),
        num_global_key_value_heads=r.choice([None, 1, kv_heads]),
        num_experts=experts,
        top_k_experts=r.randint(1, min(4, experts)),
        # mostly widths CPU grouped_mm takes (rows of 16 bytes: multiples of 4 in fp32, 8 in bf16), some it refuses
        moe_intermediate_size=r.choice([r.randint(3, 41), 4 * r.randint(2, 10), 4 * r.randint(2, 10), 8 * r.randint(1, 6)]),
        sliding_window=r.randint(3, 12),
        max_position_embeddings=512,
        final_logit_softcapping=r.choice([30.0, 7.5, 2.0, 100.0]),  # see the module docstring for "off"
        use_bidirectional_attention=r.choice([None, None, "all"]),
    )
    canvas = r.randint(8, 40)
    sizes = dict(prompt=r.randint(3, 30), pad=r.randint(1, 6), canvas=canvas, seed=seed)
    return DiffusionGemmaConfig(text_config=text, vision_config=dict(VISION), canvas_length=canvas), sizes


def grouped_experts_can_run(config: DiffusionGemmaConfig, dtype: torch.dtype) -> bool:
    """The built-in's CPU grouped_mm needs every expert row (H and I values) to span a multiple of 16 bytes."""
    text, size = config.text_config, torch.finfo(dtype).bits // 8
    return (text.hidden_size * size) % 16 == 0 and (text.moe_intermediate_size * size) % 16 == 0


def drop_duplicate_is_causal(builtin: BuiltinModel) -> None:
    """Let the built-in's encoder attention run in "all" mode (see the module docstring)."""
    for module in builtin.modules():
        if type(module).__name__ == "DiffusionGemmaEncoderTextAttention":
            def forward(*args, _forward=module.forward, _module=module, **kwargs):
                assert kwargs.pop("is_causal", _module.is_causal) == _module.is_causal
                return _forward(*args, **kwargs)

            module.forward = forward


def builtin_reference(builtin: BuiltinModel, config: DiffusionGemmaConfig) -> BuiltinModel:
    """The built-in model a user of it would run on this config: eager experts where its grouped_mm refuses the
    rows, and the duplicate `is_causal` dropped in "all" mode (see test_random_sweep.py)."""
    if not grouped_experts_can_run(config, builtin.dtype):
        builtin = BuiltinModel.from_pretrained(builtin.name_or_path, experts_implementation="eager",
                                               dtype=builtin.dtype).eval()
    if config.text_config.use_bidirectional_attention == "all":
        drop_duplicate_is_causal(builtin)
    return builtin
