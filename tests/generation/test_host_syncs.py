"""A fast lock-step denoising step (generation/step.py: decoder, LM head, processors, temperature, sampler, acceptance,
self-conditioning, the stopping decision) makes no host synchronisation: on a GPU it queues kernels without waiting.
The outer loop (generation/loop.py) reads the [B] stop flags once per step.

Syncs are counted on CPU by patching the tensor methods that would copy a device value to the host
(tests/sync_count.py). Every call of `loop.denoise_step` is counted on its own; syncs made while the model's decoder
runs (`model.denoise`, modeling code) are counted apart from the generation code's.
"""

from dataclasses import dataclass, field

import pytest
import torch

from conftest import tiny_model
from diffusiongemma.generation import loop
from sync_count import count_host_syncs

pytestmark = pytest.mark.usefixtures("one_thread")
B, P = 3, 6
KW = dict(sampling="fast", batching="lockstep", seed=[1, 2, 3], max_new_tokens=64, max_denoising_steps=6,
          eos_token_id=7, pad_token_id=0)
@dataclass
class StepSyncs:
    generation: list = field(default_factory=list)  # per step call: syncs outside the decoder
    decoder: list = field(default_factory=list)  # per step call: syncs inside model.denoise
    rows: list = field(default_factory=list)  # per step call: rows that ran the head and sampler (None: all)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture
def step_syncs(model, monkeypatch):
    """Wrap `loop.denoise_step` (and, inside it, `model.denoise`) to count the syncs of every step call."""
    record = StepSyncs()
    real_step, real_denoise = loop.denoise_step, model.denoise
    decoder_syncs = []

    def counted_step(m, state, settings):
        with count_host_syncs() as syncs:
            def denoise(*args, **kwargs):
                before = syncs.total
                out = real_denoise(*args, **kwargs)
                decoder_syncs.append(syncs.total - before)
                return out

            monkeypatch.setattr(m, "denoise", denoise)
            try:
                new_state = real_step(m, state, settings)
            finally:
                monkeypatch.setattr(m, "denoise", real_denoise)
        record.decoder.append(sum(decoder_syncs))
        record.generation.append(syncs.total - sum(decoder_syncs))
        record.rows.append(None if state.rows is None else list(state.rows))
        decoder_syncs.clear()
        return new_state

    monkeypatch.setattr(loop, "denoise_step", counted_step)
    return record


def prompts() -> torch.Tensor:
    return torch.randint(3, 128, (B, P), generator=torch.Generator().manual_seed(0))


def test_fast_lockstep_step_makes_no_host_sync(model, step_syncs):
    out = model.generate(prompts(), return_dict_in_generate=True, **KW)
    steps = len(step_syncs.generation)
    assert steps >= 2 * (out.sequences.shape[1] - P) // model.canvas_length  # a canvas takes at least 2 steps
    assert step_syncs.generation == [0] * steps
    assert step_syncs.decoder == [0] * steps
    # the skip path ran too: some steps sampled only the rows still denoising
    assert any(rows is not None and 0 < len(rows) < B for rows in step_syncs.rows), step_syncs.rows


def test_fast_lockstep_step_with_left_padding(model, step_syncs):
    mask = torch.ones(B, P, dtype=torch.long)
    mask[1, :2] = 0
    model.generate(prompts(), attention_mask=mask, **KW)
    steps = len(step_syncs.generation)
    assert steps > 0
    assert step_syncs.generation == [0] * steps  # the generation code never syncs
    assert step_syncs.decoder == [0] * steps  # the padding's slots were read before the first step


def test_outer_loop_reads_one_flag_vector_per_step_and_per_canvas(model, monkeypatch):
    """Outside the steps, the encoder passes and argument checking, the lock-step loop reads the device exactly once
    per step (the [B] stop flags) and once per canvas (the [B] finished flags)."""
    counts = {"steps": 0, "canvases": 0, "elsewhere": 0}
    with count_host_syncs() as syncs:
        def excluded(name, fn):
            def wrapper(*args, **kwargs):
                before = syncs.total
                out = fn(*args, **kwargs)
                counts["elsewhere"] += syncs.total - before
                counts[name] += 1
                return out

            return wrapper

        counts.update(denoise_step=0, encode=0, resolve_run=0)
        monkeypatch.setattr(loop, "denoise_step", excluded("denoise_step", loop.denoise_step))
        monkeypatch.setattr(loop, "resolve_run", excluded("resolve_run", loop.resolve_run))
        monkeypatch.setattr(model, "encode", excluded("encode", model.encode))
        out = model.generate(prompts(), return_dict_in_generate=True, **KW)
    loop_reads = syncs.total - counts["elsewhere"]
    canvases = (out.sequences.shape[1] - P) // model.canvas_length
    assert counts["encode"] == canvases and counts["denoise_step"] > canvases
    assert loop_reads == counts["denoise_step"] + canvases
