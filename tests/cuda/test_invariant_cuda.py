"""Batch-invariant mode on CUDA (generation/invariant.py): bf16 and fp32, mixed `generate` and the server's pool,
every row's decoder hidden states, step outputs and tokens bit-identical to its solo run. Each row runs alone at the
shapes of its solo run, so this holds if the GPU kernels are run-to-run deterministic for a fixed shape (cuBLAS
without split-K chosen by another batch, SDPA forward, grouped_mm). `torch.use_deterministic_algorithms` is on
(warn_only: an op without a deterministic CUDA kernel warns, naming itself, and the bitwise comparison decides)."""

import random

import pytest
import torch

from conftest import tiny_config, tiny_model
from invariant_helpers import CONFIGS, StepLog, bit_equal

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture
def deterministic(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(before)


def padded(prompts):
    P = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), P, dtype=torch.long, device="cuda")
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = p, 1
    return ids, mask


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", [0, 2, 3])
def test_invariant_rows_match_their_solo_run_on_cuda(case, dtype, monkeypatch, deterministic):
    rng = random.Random(case)
    model = tiny_model(tiny_config(**CONFIGS[case]), seed=case).to("cuda", dtype)
    log = StepLog(monkeypatch)
    V, L = model.config.text_config.vocab_size, model.canvas_length
    kw = dict(max_new_tokens=2 * L, max_denoising_steps=4, sampling="fast", pad_token_id=0, batch_invariant=True)
    g = torch.Generator().manual_seed(case)
    prompts = [torch.randint(3, V, (rng.randint(2, 40),), generator=g).cuda() for _ in range(6)]
    seeds = [rng.randrange(10**6) for _ in prompts]
    solo = []
    for p, s in zip(prompts, seeds):
        solo.append((model.generate(p[None], seed=[s], **kw).sequences[0, len(p):], log.take(0)))
    ids, mask = padded(prompts)
    for pool in (2, 6):
        out = model.generate(ids, attention_mask=mask, seed=seeds, max_batch_size=pool, **kw).sequences
        steps = log.take()
        for i, (tokens, solo_steps) in enumerate(solo):
            assert bit_equal(steps[i], solo_steps), f"row {i}, pool {pool}: hidden states differ from its solo run"
            assert torch.equal(out[i, ids.shape[1] : ids.shape[1] + len(tokens)], tokens)
