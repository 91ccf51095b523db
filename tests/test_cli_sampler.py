"""`diffusiongemma generate --sampler NAME --sampler-setting KEY=VALUE` (or `--sampler-preset NAME`): the sampler
reaches `generate`, bad names and settings exit with a message naming them."""

import dataclasses

import pytest
import torch

from conftest import tiny_tokenizer
from diffusiongemma import (
    BlockRefinementSamplerConfig,
    DiffusionGemmaForBlockDiffusion,
    DiscreteDDIMSamplerConfig,
    sampler_preset,
)
from diffusiongemma.cli import main


@pytest.mark.parametrize("argv,config,sampling", [
    (["--sampler", "block-refinement", "--sampler-setting", "threshold=0.5", "--sampling", "fast"],
     BlockRefinementSamplerConfig(threshold=0.5), "fast"),
    (["--sampler", "discrete-ddim", "--sampler-setting", "corrector_steps=1", "--sampler-setting", "greedy=true"],
     DiscreteDDIMSamplerConfig(corrector_steps=1, greedy=True), "reference"),
    (["--sampler-preset", "block-refinement", "--sampling", "fast"], sampler_preset("block-refinement"), "fast"),
    (["--sampler-preset", "discrete-ddim", "--sampler-setting", "corrector_steps=1"],
     dataclasses.replace(sampler_preset("discrete-ddim"), corrector_steps=1), "reference"),
])
def test_generate_with_a_sampler_prints_its_tokens(saved_pair, capsys, argv, config, sampling):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), "--max-new-tokens", "16", "--steps", "3", "--seed", "7",
                 "--quiet", *argv, "hello"]) == 0
    printed = capsys.readouterr().out
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    tok = tiny_tokenizer()
    ids = tok("hello", return_tensors="pt")["input_ids"]
    if sampling == "fast":
        out = model.generate(ids, max_new_tokens=16, max_denoising_steps=3, sampler_config=config, sampling="fast",
                             seed=7)
    else:
        torch.manual_seed(7)
        out = model.generate(ids, max_new_tokens=16, max_denoising_steps=3, sampler_config=config,
                             sampling="reference")
    assert printed.strip() == tok.decode(out.sequences[0, 5:], skip_special_tokens=True).strip()


@pytest.mark.parametrize("argv,message", [
    (["--sampler", "nope"], "unknown sampler 'nope'"),
    (["--sampler", "block-refinement", "--sampler-setting", "threshold=2"], "--sampler-setting threshold"),
    (["--sampler", "block-refinement", "--sampler-setting", "corrector_k=2"], "not a setting of the block-refinement"),
    (["--sampler", "confidence-threshold", "--sampler-setting", "factor"], "KEY=VALUE"),
    (["--sampler-setting", "entropy_bound=-1"], "--sampler-setting entropy_bound"),
    (["--sampler-preset", "fastest"], "--sampler-preset: unknown sampler preset 'fastest'; presets: entropy-bound"),
    (["--sampler-preset", "discrete-ddim", "--sampler", "discrete-ddim"], "give it or --sampler, not both"),
    (["--sampler-preset", "discrete-ddim", "--sampler-setting", "threshold=0.5"], "not a setting of the discrete-ddim"),
])
def test_bad_sampler_flags_exit_with_a_message(saved_pair, capsys, argv, message):
    path, _, _ = saved_pair
    assert main(["generate", "--model", str(path), "--quiet", *argv, "hello"]) == 2
    assert message in capsys.readouterr().err
