"""bitsandbytes 8-bit and 4-bit NF4 through `from_pretrained(quantization_config=BitsAndBytesConfig(...))`
(diffusiongemma/loading/bnb.py).

Runs on CPU with bitsandbytes >= 0.45. Its CPU 4-bit kernel needs quantized out_features to be multiples of 64 and
in_features multiples of the block size, hence the wider tiny config here.
"""

import pytest
import torch

from conftest import tiny_config, tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install --no-deps bitsandbytes)")
from transformers import BitsAndBytesConfig  # noqa: E402


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense")
    model = tiny_model(tiny_config(intermediate_size=128, head_dim=32, global_head_dim=64), seed=4)
    model.save_pretrained(path)
    return path, model


CONFIGS = {
    "int8": lambda: BitsAndBytesConfig(load_in_8bit=True),
    "nf4": lambda: BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=torch.float32),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bitsandbytes_quantizes_attention_and_mlp_linears_and_generates(dense, name):
    path, reference = dense
    try:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(path, quantization_config=CONFIGS[name](),
                                                                device_map="cpu")
    except (RuntimeError, NotImplementedError) as err:  # a bitsandbytes build without CPU kernels
        pytest.skip(f"bitsandbytes {bnb.__version__} cannot run {name} on this CPU: {err}")
    quantized = bnb.nn.Linear8bitLt if name == "int8" else bnb.nn.Linear4bit
    layer = model.model.decoder.layers[5]
    for linear in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.down_proj):
        assert isinstance(linear, quantized)
    # full precision: experts (3-D parameters, not Linears), routers, lm_head, self-conditioning, vision tower
    assert layer.experts.gate_up_proj.dtype == torch.float32
    for linear in (layer.router.proj, model.lm_head, model.model.decoder.self_conditioning.up_proj,
                   model.model.encoder.embed_vision.embedding_projection):
        assert type(linear) is torch.nn.Linear
    assert not any(isinstance(m, quantized) for m in model.model.encoder.vision_tower.modules())

    g = torch.Generator().manual_seed(0)
    ids, canvas = torch.randint(3, 128, (1, 9), generator=g), torch.randint(0, 128, (1, 16), generator=g)
    with torch.no_grad():
        q = model(input_ids=ids, decoder_input_ids=canvas).logits.log_softmax(-1)
        p = reference(input_ids=ids, decoder_input_ids=canvas).logits.log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1).mean().item()
    print(f"\nbitsandbytes {name}: mean KL(orig || quantized) {kl:.5f}")
    assert kl < 0.5

    def run():
        torch.manual_seed(3)
        out = model.generate(ids, max_new_tokens=16, max_denoising_steps=3)
        return out.sequences if hasattr(out, "sequences") else out

    first = run()
    assert first.shape == (1, 9 + 16) and torch.equal(first, run())


def test_4bit_on_cpu_keeps_layers_its_kernel_cannot_run(tmp_path, caplog):
    """hidden_size 48 (not a multiple of the 64 block): bitsandbytes' CPU 4-bit path fails on such layers deep
    inside bitsandbytes on AVX512-BF16 CPUs ("N must be divisible by block_n"). They stay unquantized, with one
    warning naming them, and the model generates; the user's config object is unchanged."""
    import logging

    from diffusiongemma.loading.bnb import cpu_4bit_failure

    model = tiny_model(tiny_config(hidden_size=48, moe_intermediate_size=24), seed=1)
    model.save_pretrained(tmp_path)
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
    with caplog.at_level(logging.WARNING, logger="diffusiongemma.loading.bnb"):
        try:
            quantized = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path, quantization_config=config,
                                                                        device_map="cpu")
        except (RuntimeError, NotImplementedError) as err:
            pytest.skip(f"bitsandbytes {bnb.__version__} cannot run 4-bit on this CPU: {err}")
    assert config.llm_int8_skip_modules is None
    fails_here = cpu_4bit_failure(48, 64, config) is not None
    warnings = [r for r in caplog.records if "cannot run" in r.getMessage()]
    assert len(warnings) == (1 if fails_here else 0)
    if fails_here:
        assert "48 -> 64" in warnings[0].getMessage() and "stay unquantized" in warnings[0].getMessage()
    for name, module in quantized.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            assert cpu_4bit_failure(module.in_features, module.out_features, config) is None, name
    out = quantized.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=16, max_denoising_steps=2)
    assert out.sequences.shape == (1, 19)
