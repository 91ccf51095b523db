"""Compiled mixed batching (`generate(compile=..., batching="mixed")`: passes.RowForward over a `RowCache` with the
fixed-shape `modeling.compile.RowDenoisePass`): the tokens of the eager mixed pool, one graph per (row bucket,
capacity bucket) whatever the prompt lengths, admissions, commits, rows leaving and canvases, and no graph break.

Graphs are traced with dynamo's counting backend (the eager backend underneath: fast on CPU)."""

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from conftest import tiny_model
from diffusiongemma import BlockRefinementSamplerConfig, DiscreteDDIMSamplerConfig
from diffusiongemma.modeling.compile import row_bucket

pytestmark = pytest.mark.usefixtures("one_thread")
L = 16
KW = dict(max_new_tokens=48, max_denoising_steps=10, pad_token_id=0, stability_threshold=0, confidence_threshold=0.8,
          return_dict_in_generate=True, sampling="fast", batching="mixed")


@pytest.fixture(scope="module")
def model():
    """Sharp logits: rows converge at different steps, so rows commit, leave and get refilled at different passes."""
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    return model


def batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of these lengths and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    P = max(lengths)
    ids = torch.randint(3, 128, (len(lengths), P), generator=g)
    mask = torch.zeros(len(lengths), P, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, P - n :] = 1
    return ids * mask, mask


def test_compiled_mixed_pool_keeps_the_tokens_and_compiles_once_per_bucket(model, buckets):
    counter = CompileCounter()
    counters.clear()
    # 5 prompts through 3 slots: rows arrive and leave; prompts shorter than L prefill beside denoising rows
    for lengths, seed in (([6, 3, 9, 12, 5], 0), ([4, 11, 7, 2, 8], 1), ([10, 1, 5, 6, 3], 2)):
        ids, mask = batch(lengths, seed)
        kw = dict(KW, attention_mask=mask, seed=[7, 8, 9, 10, 11], max_batch_size=3)
        eager = model.generate(ids, **kw)
        compiled = model.generate(ids, compile={"backend": counter}, **kw)
        assert torch.equal(compiled.sequences, eager.sequences)
        torch.testing.assert_close(compiled.tokens_per_forward, eager.tokens_per_forward)
    assert len(buckets) > 30
    assert {c for _, c in buckets} == {64}  # prompts of 1..12 + 3 canvases of 16: one capacity bucket
    assert {r for r, _ in buckets} <= {1, 2, 3}
    assert counter.frame_count == len(set(buckets))  # one graph per bucket over ~100 passes and 3 calls
    assert not counters["graph_break"]


def test_later_calls_with_other_prompts_compile_only_buckets_not_seen_before(model, buckets):
    counter = CompileCounter()
    counters.clear()
    kw = dict(KW, seed=3, compile={"backend": counter})
    for lengths, seed in (([5, 9, 2, 7], 3), ([8, 3, 11, 6], 4), ([1, 12, 4, 10], 5), ([6, 6, 2, 9], 6)):
        before, graphs = set(buckets), counter.frame_count
        ids, mask = batch(lengths, seed)
        model.generate(ids, **dict(kw, attention_mask=mask))
        assert counter.frame_count - graphs == len(set(buckets) - before)  # new prompt lengths, same buckets: 0
    assert counter.frame_count == len(set(buckets)) <= 3  # R in {1, 2, 4}, one capacity bucket
    assert not counters["graph_break"]


def test_row_buckets_are_powers_of_two_capped_at_the_slots():
    assert [row_bucket(n, 8) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert [row_bucket(n, 3) for n in range(1, 4)] == [1, 2, 3]


def test_compile_with_batch_invariant_is_refused(model):
    ids, mask = batch([3, 5], 0)
    with pytest.raises(ValueError, match="batch_invariant=True .* cannot run with compile: "):
        model.generate(ids, attention_mask=mask, seed=1, batch_invariant=True, compile={"backend": "eager"},
                       **dict(KW, batching=None))


class PassCopies:
    """Per `RowPool.step`: host syncs (tests/sync_count.py) and blocking host-to-device copies, i.e. tensors built
    from host values straight onto a device (`torch.tensor(..., device=...)`, `torch.as_tensor(..., device=...)`:
    a pageable copy the host waits for on CUDA; `modeling.host.device_tensor` is the asynchronous way)."""

    def __init__(self, monkeypatch):
        from diffusiongemma.generation.pool import RowPool
        from sync_count import count_host_syncs

        self.syncs, self.copies, self.passes = [], [], 0
        copies = [0]
        for name in ("tensor", "as_tensor"):
            real = getattr(torch, name)

            def counted(*args, real=real, **kwargs):
                copies[0] += kwargs.get("device") is not None
                return real(*args, **kwargs)

            monkeypatch.setattr(torch, name, counted)
        inner = RowPool.step

        def step(pool):
            copies[0] = 0
            with count_host_syncs() as syncs:
                events = inner(pool)
            self.syncs.append(syncs.total)
            self.copies.append(copies[0])
            return events

        monkeypatch.setattr(RowPool, "step", step)


@pytest.mark.parametrize("sampler", [dict(), dict(sampler_config=BlockRefinementSamplerConfig(), stability_threshold=1),
                                     dict(sampler_config=DiscreteDDIMSamplerConfig(), stability_threshold=1)],
                         ids=["entropy-bound", "block-refinement", "discrete-ddim"])
def test_a_compiled_mixed_pass_reads_the_device_once_and_copies_asynchronously(model, monkeypatch, sampler):
    ids, mask = batch([6, 3, 9, 12], 5)
    watch = PassCopies(monkeypatch)
    model.generate(ids, attention_mask=mask, seed=4, max_batch_size=3, compile={"backend": "eager"},
                   **dict(KW, **sampler))
    assert len(watch.syncs) > 10
    if not sampler:  # the commit samplers' CPU-only exact multinomial reads the host on CPU (never on CUDA)
        assert max(watch.syncs) <= 1, watch.syncs  # the stop/EOS/fault flags of the rows that sampled
    assert max(watch.copies) == 0, watch.copies  # e.g. the temperatures of rows at different steps
