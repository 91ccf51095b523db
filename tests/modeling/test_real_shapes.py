"""The 26B-A4B configuration (spec A.4) builds the module tree and tensor shapes of spec B.1 (on the meta device)."""

import torch

from diffusiongemma import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

TEXT_26B = dict(
    vocab_size=262144, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30, num_attention_heads=16,
    num_key_value_heads=8, num_global_key_value_heads=2, head_dim=256, global_head_dim=512,
    use_bidirectional_attention="vision", num_experts=128, moe_intermediate_size=704, top_k_experts=8,
    sliding_window=1024, final_logit_softcapping=30.0, max_position_embeddings=262144,
)
VISION_26B = dict(
    model_type="gemma4_vision", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
    num_key_value_heads=16, head_dim=72, pooling_kernel_size=3, use_clipped_linears=False, standardize=True,
)


def test_26b_shapes_and_parameter_count():
    config = DiffusionGemmaConfig(text_config=TEXT_26B, vision_config=VISION_26B, canvas_length=256)
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    p = "model.decoder.layers."
    assert shapes[p + "0.self_attn.q_proj.weight"] == (4096, 2816)
    assert shapes[p + "0.self_attn.v_proj.weight"] == (2048, 2816)
    assert shapes[p + "5.self_attn.q_proj.weight"] == (8192, 2816)
    assert shapes[p + "5.self_attn.k_proj.weight"] == (1024, 2816)
    assert p + "5.self_attn.v_proj.weight" not in shapes  # full layers reuse keys as values
    assert shapes[p + "5.self_attn.q_norm.weight"] == (512,)
    assert shapes[p + "0.experts.gate_up_proj"] == (128, 1408, 2816)
    assert shapes[p + "0.experts.down_proj"] == (128, 2816, 704)
    assert shapes[p + "0.router.proj.weight"] == (128, 2816)
    assert shapes["model.decoder.self_conditioning.gate_proj.weight"] == (2112, 2816)
    assert shapes["model.encoder.embed_vision.embedding_projection.weight"] == (2816, 1152)
    assert shapes["model.encoder.language_model.layers.29.layer_scalar"] == (1,)
    unique = {id(t): t.numel() for t in model.parameters()}
    total = sum(unique.values())
    # From the B.1 shapes: experts 22.84 B + other text 1.66 B + embeddings 0.74 B + vision 0.57 B + SC 0.02 B.
    # (Spec A.4's summary says 2.03 B for "other text", which its own B.1 shapes do not add up to.)
    assert total == 25_823_778_864
