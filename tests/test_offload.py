"""Bigger than memory: accelerate CPU + disk offload through `from_pretrained(device_map="auto", ...)`.

A tiny model is split over CPU and disk by a small `max_memory`; it must give the same logits and generate the same
tokens as the in-memory model, keep every layer whole, and keep the embeddings (read outside their forward by
self-conditioning) off the disk. The same holds for a compressed FP8 checkpoint.
"""

import re

import pytest
import torch

from conftest import tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.quantization.quantize import quantize_checkpoint


def inputs():
    g = torch.Generator().manual_seed(0)
    ids, canvas = torch.randint(3, 128, (1, 9), generator=g), torch.randint(0, 128, (1, 16), generator=g)
    return ids, canvas, torch.randn(1, 16, 128, generator=g)


def outputs(model):
    ids, canvas, sc_logits = inputs()
    with torch.no_grad():
        plain = model(input_ids=ids, decoder_input_ids=canvas).logits
        sc = model(input_ids=ids, decoder_input_ids=canvas, self_conditioning_logits=sc_logits).logits
    torch.manual_seed(5)
    out = model.generate(ids, max_new_tokens=32, max_denoising_steps=3)
    return plain, sc, out.sequences if hasattr(out, "sequences") else out


def check_split(model):
    devices = model.hf_device_map
    assert "disk" in devices.values() and "cpu" in devices.values(), devices
    assert devices["model.decoder.embed_tokens"] == "cpu" and devices["lm_head"] == "cpu"
    for name in devices:  # a DiffusionGemmaLayer is never split across devices
        assert not re.match(r"model\.decoder\.layers\.\d+\.", name), name


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense")
    model = tiny_model(seed=8)
    model.save_pretrained(path)
    return path, model


def test_cpu_and_disk_offload_generates_like_the_in_memory_model(dense, tmp_path):
    path, model = dense
    offloaded = DiffusionGemmaForBlockDiffusion.from_pretrained(
        path, device_map="auto", max_memory={"cpu": "400KB"}, offload_folder=tmp_path / "offload")
    check_split(offloaded)
    assert any(p.device.type == "meta" for p in offloaded.parameters())  # really offloaded
    for a, b in zip(outputs(model), outputs(offloaded)):
        assert torch.equal(a, b)


def test_fp8_checkpoint_offloads_to_disk_compressed(dense, tmp_path):
    path, _ = dense
    quantize_checkpoint(str(path), str(tmp_path / "fp8"), "fp8-dynamic")
    in_memory = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "fp8")
    offloaded = DiffusionGemmaForBlockDiffusion.from_pretrained(
        tmp_path / "fp8", device_map="auto", max_memory={"cpu": "300KB"}, offload_folder=tmp_path / "offload")
    check_split(offloaded)
    assert (tmp_path / "offload").exists()
    for a, b in zip(outputs(in_memory), outputs(offloaded)):
        assert torch.equal(a, b)
