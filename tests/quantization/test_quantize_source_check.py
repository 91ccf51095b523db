"""`diffusiongemma quantize` refuses a source that is already quantized (quantization/quantize.py
`check_not_quantized`), through the real entry point."""

import os
import subprocess
import sys

import pytest

from conftest import tiny_model
from ct_checkpoint import REGEX_IGNORE, write_compressed_checkpoint
from diffusiongemma.quantization.quantize import check_not_quantized

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def fp8_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8")
    write_compressed_checkpoint(tiny_model(seed=2), path, "FP8_DYNAMIC", REGEX_IGNORE)
    return path


def test_already_quantized_source_is_refused_by_the_command(fp8_folder, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "diffusiongemma", "quantize", "--scheme", "nvfp4", str(fp8_folder),
                          str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode != 0
    assert "is already quantized (compressed-tensors, format float-quantized)" in run.stderr
    assert "quantize the unquantized (bf16) checkpoint" in run.stderr
    assert not out.exists()  # nothing written under an nvfp4 config


def test_bitsandbytes_source_is_refused_too(tmp_path):
    (tmp_path / "config.json").write_text('{"quantization_config": {"quant_method": "bitsandbytes"}}')
    with pytest.raises(ValueError, match=r"already quantized \(bitsandbytes\)"):
        check_not_quantized(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "diffusion_gemma"}')
    check_not_quantized(str(tmp_path))  # an unquantized source passes


def test_a_source_of_another_model_type_is_refused(tmp_path):
    """The command loads the dense source through AutoModelForCausalLM (quantization sits below the public class):
    a checkpoint that maps to another class is refused, naming it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from diffusiongemma.quantization.quantize import dense_model, quantize_checkpoint

    LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="is not a DiffusionGemma checkpoint .*LlamaForCausalLM"):
        quantize_checkpoint(str(tmp_path / "llama"), str(tmp_path / "out"), "fp8-dynamic")
    tiny_model().save_pretrained(tmp_path / "ours")
    assert type(dense_model(str(tmp_path / "ours"))).__name__ == "DiffusionGemmaForBlockDiffusion"
