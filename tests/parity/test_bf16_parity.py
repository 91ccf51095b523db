"""bfloat16 parity (the released checkpoints' dtype): both classes load one folder with `dtype=torch.bfloat16` and
must give bit-identical logits and identical same-seed tokens, on the suite's tiny config and on irregular configs of
the random sweep (random_configs.py)."""

import pytest
import torch

from conftest import pair, tiny_config
from random_configs import builtin_reference, random_config

CONFIGS = ["tiny", 20261204, 20261208, 20261215, 20261206, 20261213]  # sweep seeds: top-3/4, "all", eager experts


@pytest.fixture(scope="module", params=CONFIGS, ids=str)
def case(request, tmp_path_factory):
    if request.param == "tiny":
        config, sizes = tiny_config(), dict(prompt=13, pad=4, canvas=16, seed=0)
    else:
        config, sizes = random_config(request.param)
    builtin, ours = pair(tmp_path_factory.mktemp(f"bf16_{request.param}"), config, dtype=torch.bfloat16)
    assert builtin.dtype == ours.dtype == torch.bfloat16
    return builtin_reference(builtin, config), ours, sizes


def prompts(ours, sizes):
    V, P = ours.config.text_config.vocab_size, sizes["prompt"]
    g = torch.Generator().manual_seed(sizes["seed"])
    ids = torch.randint(3, V, (2, P), generator=g)
    mask = torch.ones(2, P, dtype=torch.long)
    mask[1, : min(sizes["pad"], P - 1)] = 0
    return ids * mask, mask, torch.randint(0, V, (2, sizes["canvas"]), generator=g)


@torch.no_grad()
def test_bf16_logits_are_identical(case):
    builtin, ours, sizes = case
    ids, mask, canvas = prompts(ours, sizes)
    for kwargs in (dict(input_ids=ids, decoder_input_ids=canvas),
                   dict(input_ids=ids, attention_mask=mask, decoder_input_ids=canvas)):
        expected, got = builtin(**kwargs).logits, ours(**kwargs).logits
        assert got.dtype == torch.float32
        assert torch.equal(expected, got), f"max |diff| {(expected - got).abs().max().item():.3g}"


@torch.no_grad()
def test_bf16_generate_tokens_are_identical(case):
    builtin, ours, sizes = case
    ids, mask, _ = prompts(ours, sizes)
    settings = dict(max_new_tokens=2 * sizes["canvas"], max_denoising_steps=4)
    for args in (dict(input_ids=ids[:1]), dict(input_ids=ids, attention_mask=mask)):
        torch.manual_seed(sizes["seed"])
        expected = builtin.generate(**args, **settings).sequences
        torch.manual_seed(sizes["seed"])
        assert torch.equal(expected, ours.generate(**args, **settings).sequences)
