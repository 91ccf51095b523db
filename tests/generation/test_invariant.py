"""Batch-invariant mode (generation/invariant.py): in mixed `generate` a seeded row's decoder hidden states, step
outputs (entropy, self-conditioning input) and tokens are bit-identical to its solo run, over random irregular
configs, prompt lengths, pool sizes and batch orders; the default mode is shown not to be (so the switch matters)."""

import random

import pytest
import torch

from conftest import tiny_config, tiny_model
from invariant_helpers import CONFIGS, StepLog, bit_equal

pytestmark = pytest.mark.usefixtures("one_thread")

def padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    P = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = p, 1
    return ids, mask


def run_case(model, log, rng: random.Random, batch_invariant: bool, rows: int):
    """Random prompts (lengths 2-40), per-row seeds, a random pool size; returns per row (solo tokens, solo steps,
    batched tokens, batched steps)."""
    V, L = model.config.text_config.vocab_size, model.canvas_length
    kw = dict(max_new_tokens=2 * L, max_denoising_steps=rng.choice([3, 4]), sampling="fast", pad_token_id=0,
              t_min=rng.choice([0.2, 0.6]), batch_invariant=batch_invariant)
    g = torch.Generator().manual_seed(rng.randrange(10**6))
    prompts = [torch.randint(3, V, (rng.randint(2, 40),), generator=g) for _ in range(rows)]
    seeds = [rng.randrange(10**6) for _ in range(rows)]
    solo = []
    for p, s in zip(prompts, seeds):
        tokens = model.generate(p[None], seed=[s], batching="mixed", **kw).sequences[0, len(p):]
        solo.append((tokens, log.take(0)))
    ids, mask = padded(prompts)
    out = model.generate(ids, attention_mask=mask, seed=seeds, batching="mixed",
                         max_batch_size=rng.randint(2, rows), **kw).sequences
    steps = log.take()
    P = ids.shape[1]
    return [(t, s, out[i, P : P + len(t)], steps[i]) for i, (t, s) in enumerate(solo)]


@pytest.mark.parametrize("case", range(len(CONFIGS)))
def test_invariant_rows_are_bit_identical_to_their_solo_run(case, monkeypatch):
    rng = random.Random(case)
    model = tiny_model(tiny_config(**CONFIGS[case]), seed=case)
    log = StepLog(monkeypatch)
    for solo_tokens, solo_steps, tokens, steps in run_case(model, log, rng, True, rows=rng.randint(3, 5)):
        assert bit_equal(steps, solo_steps)  # hidden states, entropies, soft inputs, canvases: every bit
        assert torch.equal(tokens, solo_tokens)


def test_default_mode_is_not_bit_invariant(monkeypatch):
    """Without the switch the shared forward reaches a row's hidden states (CPU: GEMM blocking by row count,
    grouped expert GEMMs, packed attention); seen on every row of this case at the first step."""
    rng = random.Random(7)
    model = tiny_model(tiny_config(**CONFIGS[2]), seed=2)
    log = StepLog(monkeypatch)
    results = run_case(model, log, rng, False, rows=5)
    assert not all(bit_equal(steps, solo_steps) for _, solo_steps, _, steps in results)


def test_invariant_first_canvas_inputs_and_bf16(monkeypatch):
    """bf16 weights, a seeded first canvas and first self-conditioning logits (embedded row by row)."""
    model = tiny_model(tiny_config(**CONFIGS[0]), seed=3).to(torch.bfloat16)
    log = StepLog(monkeypatch)
    L, V = model.canvas_length, model.config.text_config.vocab_size
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, V, (n,), generator=g) for n in (4, 17, 9)]
    first = torch.randint(3, V, (3, L), generator=g)
    sc = torch.randn(3, L, V, generator=g)
    kw = dict(max_new_tokens=2 * L, max_denoising_steps=3, sampling="fast", pad_token_id=0, batch_invariant=True)
    solo = []
    for i, p in enumerate(prompts):
        tokens = model.generate(p[None], seed=[i], decoder_input_ids=first[i : i + 1],
                                self_conditioning_logits=sc[i : i + 1], **kw).sequences[0, len(p):]
        solo.append((tokens, log.take(0)))
    ids, mask = padded(prompts)
    out = model.generate(ids, attention_mask=mask, seed=[0, 1, 2], decoder_input_ids=first,
                         self_conditioning_logits=sc, max_batch_size=2, **kw).sequences
    steps = log.take()
    for i, (tokens, solo_steps) in enumerate(solo):
        assert bit_equal(steps[i], solo_steps)
        assert torch.equal(out[i, ids.shape[1] : ids.shape[1] + len(tokens)], tokens)


@pytest.mark.parametrize("bad, message", [
    (dict(batching="lockstep"), "batching='lockstep'"),
    (dict(compile=True), "compile"),
    (dict(sampling="reference", seed=None), "batch_invariant"),
])
def test_invariant_refuses_what_cannot_hold_the_guarantee(bad, message):
    model = tiny_model(tiny_config(**CONFIGS[0]))
    kw = dict(max_new_tokens=8, max_denoising_steps=2, sampling="fast", seed=0, batch_invariant=True)
    with pytest.raises(ValueError, match=message):
        model.generate(torch.arange(3, 9)[None], **dict(kw, **bad))


def test_batch_invariant_must_be_a_bool():
    model = tiny_model(tiny_config(**CONFIGS[0]))
    with pytest.raises(TypeError, match="batch_invariant"):
        model.generate(torch.arange(3, 9)[None], max_new_tokens=8, sampling="fast", seed=0, batch_invariant="yes")


@torch.no_grad()
def test_invariant_image_prompts():
    """One image prompt per call runs in the mode (and gives its own tokens again, through the pool); a batch of
    image prompts is refused, since the vision tower encodes a batch's images together."""
    from vision_builders import image_prompt, random_image, tiny_processor, tiny_vision_config

    model, processor = tiny_model(tiny_vision_config()), tiny_processor()
    images = [random_image(40, 60, 0), random_image(90, 30, 1)]
    kw = dict(max_new_tokens=32, max_denoising_steps=2, sampling="fast", batch_invariant=True)
    one = image_prompt(["two <x125> images <x125>"], [images], processor)
    first = model.generate(**one, seed=[3], **kw).sequences
    assert torch.equal(model.generate(**one, seed=[3], **kw).sequences, first)
    two = image_prompt(["two <x125> images <x125>", "one <x125>"], [images, images[1:]], processor)
    with pytest.raises(ValueError, match="batch_invariant=True` with image prompts"):
        model.generate(**two, seed=[3, 4], **kw)


@pytest.mark.parametrize("attn", ["eager"])  # flex_attention passed too, but its unfused CPU path takes ~30 s here
def test_invariant_with_other_attention_backends(attn, monkeypatch):
    config = tiny_config(**CONFIGS[1])
    config._attn_implementation = attn
    model = tiny_model(config, seed=1)
    assert model.attention_backend == {"eager": "eager", "flex_attention": "flex"}[attn]
    log = StepLog(monkeypatch)
    for solo_tokens, solo_steps, tokens, steps in run_case(model, log, random.Random(11), True, rows=3):
        assert bit_equal(steps, solo_steps)
        assert torch.equal(tokens, solo_tokens)


@pytest.mark.parametrize("config_name", ["BlockRefinementSamplerConfig", "ConfidenceThresholdSamplerConfig",
                                         "DiscreteDDIMSamplerConfig"])
def test_invariant_holds_for_the_other_per_row_samplers(config_name, monkeypatch):
    """The commit-style samplers carry per-row state through the pool (`sampler_state`): still every bit."""
    import diffusiongemma

    rng = random.Random(3)
    model = tiny_model(tiny_config(**CONFIGS[1]), seed=1)
    model.generation_config.sampler_config = getattr(diffusiongemma, config_name)()
    log = StepLog(monkeypatch)
    for solo_tokens, solo_steps, tokens, steps in run_case(model, log, rng, True, rows=3):
        assert bit_equal(steps, solo_steps)
        assert torch.equal(tokens, solo_tokens)
