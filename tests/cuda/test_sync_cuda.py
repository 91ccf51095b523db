"""Host syncs on CUDA, counted by CUDA itself (`torch.cuda.set_sync_debug_mode`), which also sees what
tests/sync_count.py cannot patch (boolean-mask indexing, blocking host-to-device copies): a denoising pass and an
encoder pass make none; a mixed-batching scheduler pass makes at most one (its read of the rows' stop flags)."""

import warnings

import pytest
import torch

from conftest import tiny_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
L = 16


class SyncDebug:
    """`with SyncDebug("error")`: any synchronising CUDA call raises; "warn": every one is recorded in `.records`."""

    def __init__(self, mode: str):
        self.mode, self.records = mode, []

    def __enter__(self):
        self._catch = warnings.catch_warnings(record=True)
        self.records = self._catch.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(self.mode)
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(0)
        self._catch.__exit__(*exc)

    @property
    def syncs(self) -> list[str]:
        return [str(w.message) for w in self.records if "synchroniz" in str(w.message)]


@pytest.mark.parametrize("padded", [False, True])
@torch.no_grad()
def test_encode_and_denoise_passes_never_sync(padded):
    model = tiny_model().to("cuda", torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (2, 12), generator=g).cuda()
    canvas = torch.randint(3, 128, (2, L), generator=g).cuda()
    keep = None
    if padded:
        keep = torch.ones(2, 12 + 2 * L, dtype=torch.bool, device="cuda")
        keep[1, :4] = False
    cache = model.new_cache()
    model.encode(ids, cache, keep=keep)
    logits = model.head(model.denoise(canvas, cache, None, keep=keep))  # warm-up; reads the padding once
    torch.cuda.synchronize()
    with SyncDebug("error"):
        for _ in range(2):
            soft = model.get_decoder().soft_embedding(logits.to(torch.bfloat16))
            logits = model.head(model.denoise(canvas, cache, soft, keep=keep))
        model.encode(canvas, cache, keep=keep)  # commit
        model.head(model.denoise(canvas, cache, None, keep=keep))  # the next canvas


# bf16, the serving dtype: in fp32 torch's grouped_mm has no CUDA kernel and its fallback loop reads the expert offsets
# on the host, twice per MoE layer (modeling/moe.py). That likely explains the first H200 run's 12-14 syncs per pass
# in fp32 (2 x 6 layers, the flag read, and the blocking row-temperature copy engine.row_temperatures made then, now
# asynchronous); not yet re-run on a GPU.
def test_mixed_scheduler_pass_syncs_at_most_once(monkeypatch):
    model = tiny_model().to("cuda", torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # sharp logits: rows converge at different steps
    ids = torch.randint(3, 128, (4, 6), generator=torch.Generator().manual_seed(0)).cuda()
    kw = dict(sampling="fast", seed=3, batching="mixed", max_new_tokens=48, max_denoising_steps=10, pad_token_id=0,
              stability_threshold=0, confidence_threshold=0.8)
    model.generate(ids, **kw)  # warm-up (kernels, pinned host buffers)
    marks = []
    inner = model.run_rows
    with SyncDebug("warn") as debug:
        monkeypatch.setattr(model, "run_rows", lambda *a: marks.append(len(debug.syncs)) or inner(*a))
        model.generate(ids, **kw)
    per_pass = [b - a for a, b in zip(marks, marks[1:])]
    assert len(per_pass) > 10
    assert max(per_pass) <= 1, (per_pass, debug.syncs[:5])


def test_compiled_mixed_pass_syncs_at_most_once(monkeypatch):
    """A compiled mixed pass (passes.RowForward + RowDenoisePass): lengths live on the device (RowCache.lengths_t),
    the encoder rows' bookkeeping is copied asynchronously, so a pass reads the device once (the stop flags)."""
    from diffusiongemma.generation.pool import RowPool

    model = tiny_model().to("cuda", torch.bfloat16)  # bf16: see test_mixed_scheduler_pass_syncs_at_most_once
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    ids = torch.randint(3, 128, (4, 6), generator=torch.Generator().manual_seed(0)).cuda()
    kw = dict(sampling="fast", seed=3, batching="mixed", max_new_tokens=48, max_denoising_steps=10, pad_token_id=0,
              stability_threshold=0, confidence_threshold=0.8, max_batch_size=2, compile=True)  # buckets 1, 2
    model.generate(ids, **kw)  # warm-up: compiles the row buckets (kernels, pinned host buffers)
    model.generate(ids, **kw)
    marks = []
    inner = RowPool.step
    with SyncDebug("warn") as debug:
        monkeypatch.setattr(RowPool, "step", lambda pool: marks.append(len(debug.syncs)) or inner(pool))
        model.generate(ids, **kw)
    per_pass = [b - a for a, b in zip(marks, marks[1:])]
    assert len(per_pass) > 10
    assert max(per_pass) <= 1, (per_pass, debug.syncs[:5])
