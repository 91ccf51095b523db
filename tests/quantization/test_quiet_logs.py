"""Logs of the quantized and offloaded paths (loading/bnb.py, loading/offload.py): a bitsandbytes 8-bit
generate prints at most one line, bitsandbytes' import-time kernels-community warning is kept out of the output, and
`device_map="auto"` does not print accelerate's "weights are not tied" warning (the built-in class does not either).

The bitsandbytes runs happen in a fresh interpreter: its warnings depend on what was imported and logged before.
"""

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import tiny_config, tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code: str, *args, pythonpath=()) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), REPO]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)


def test_bitsandbytes_8bit_generate_logs_at_most_one_line(tmp_path):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    tiny_model(tiny_config(intermediate_size=128, head_dim=32, global_head_dim=64), seed=4).save_pretrained(tmp_path)
    run = run_python("""
        import sys
        import torch
        from transformers import BitsAndBytesConfig
        from diffusiongemma import DiffusionGemmaForBlockDiffusion
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(
            sys.argv[1], quantization_config=BitsAndBytesConfig(load_in_8bit=True), device_map="cpu")
        print("=== generate", file=sys.stderr, flush=True)
        torch.manual_seed(0)
        out = model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=32, max_denoising_steps=4)
        print(out.sequences.shape[1])
    """, tmp_path)
    if run.returncode != 0 and "NotImplementedError" in run.stderr:
        pytest.skip("this bitsandbytes build has no CPU 8-bit kernel")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "36"
    during = run.stderr.split("=== generate\n", 1)[1].splitlines()
    # without the filter: one "MatMul8bitLt: inputs will be cast" line per 8-bit matmul (hundreds here)
    assert len(during) <= 1, during[:3]
    assert "kernels-community" not in run.stderr


def test_kernels_community_import_warning_goes_to_the_debug_log(tmp_path):
    """A stand-in bitsandbytes package logs the warning the real one logs at import on CPUs with AVX512-BF16."""
    fake = tmp_path / "bitsandbytes"
    (fake / "backends" / "cpu").mkdir(parents=True)
    (fake / "__init__.py").write_text("from .backends.cpu import ops\n")
    (fake / "backends" / "__init__.py").write_text("")
    (fake / "backends" / "cpu" / "__init__.py").write_text("")
    (fake / "backends" / "cpu" / "ops.py").write_text(
        "import logging\n"
        "logging.getLogger(__name__).warning('Failed to load CPU gemm_4bit_forward from kernels-community: %s', 'x')\n"
        "logging.getLogger(__name__).warning('another bitsandbytes warning')\n")
    run = run_python("""
        import logging
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
        from diffusiongemma.loading.bnb import import_bitsandbytes_quietly
        import_bitsandbytes_quietly()
    """, pythonpath=[tmp_path])
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if "bitsandbytes" in line]
    assert "WARNING bitsandbytes.backends.cpu.ops another bitsandbytes warning" in lines
    assert not any(line.startswith("WARNING") and "kernels-community" in line for line in lines)
    assert any(line.startswith("DEBUG diffusiongemma.loading.bnb") and "kernels-community" in line
               for line in lines)


def test_device_map_auto_does_not_warn_about_untied_weights(tmp_path, caplog):
    tiny_model(seed=2).save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path, device_map="auto")
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    assert "not tied" not in caplog.text
