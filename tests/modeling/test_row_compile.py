"""The compiled mixed pass over a `RowCache` (passes.RowForward with modeling/compile.py `RowDenoisePass`): encoder rows
eager over their slots only (`RowCache.rows`), denoising rows through the fixed-shape pass of the row bucket. Every
row's logits are its solo run's (to float rounding: the static pass attends over masked extra slots), including a
row that prefilled a prompt shorter than the canvas in the pass where the bucket wrote garbage canvases past its
committed length, and the sliding-window rule (reference or symmetric) is the eager row pass's."""

from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from conftest import tiny_config, tiny_model
from diffusiongemma.generation.passes import COMMIT, DENOISE, PREFILL, RowForward
from diffusiongemma.modeling.cache import RowCache
from diffusiongemma.modeling.compile import RowDenoisePass

pytestmark = pytest.mark.usefixtures("one_thread")
L = 16


class Alone:
    """One row through the ordinary encode/denoise path with its own BlockDiffusionCache."""

    def __init__(self, model):
        self.model, self.cache = model, model.new_cache()

    def encode(self, ids):
        self.model.encode(ids[None], self.cache)

    def logits(self, canvas, soft):
        return self.model.head(self.model.denoise(canvas[None], self.cache, None if soft is None else soft[None]))[0]


def row(phase, tokens, soft=None):
    return SimpleNamespace(phase=phase, tokens=tokens, soft=soft, images=None)


@pytest.mark.parametrize("window", ["reference", "symmetric"])
@torch.no_grad()
def test_row_pass_logits_equal_each_row_alone(window):
    config = tiny_config()
    config.text_config.decoder_window = window
    model = tiny_model(config)
    model.get_decoder().decoder_window = window
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, 128, (n,), generator=g)  # noqa: E731
    counter = CompileCounter()
    cache = RowCache(model.get_decoder().shapes, batch=4, capacity=96)
    forward = RowForward(model, cache, denoise_pass=RowDenoisePass(model, backend=counter), capacity=64)
    a, b, c = Alone(model), Alone(model), Alone(model)
    pa, pb, pc = ids(5), ids(11), ids(3)  # shorter and longer than the window 8; pc shorter than the canvas
    ca, cb, cb2, cc = ids(L), ids(L), ids(L), ids(L)
    sb = torch.randn(L, 64, generator=g)
    # pass 1: two prefills (no denoising row: the compiled pass does not run)
    out = forward([row(PREFILL, pa), row(PREFILL, pb)])
    assert out.sampled == [] and out.logits is None
    a.encode(pa), b.encode(pb)
    # pass 2: A (first step) and B denoise; C, admitted into slot 2, prefills 3 tokens beside them (bucket R = 4)
    cache.reset(2)
    out = forward([row(DENOISE, ca), row(DENOISE, cb, sb), row(PREFILL, pc)])
    c.encode(pc)
    assert out.sampled == [0, 1]
    torch.testing.assert_close(out.logits[0], a.logits(ca, None), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits[1], b.logits(cb, sb), atol=1e-5, rtol=1e-5)
    assert cache.lengths[:3] == [5, 11, 3] and cache.lengths_t[:3].tolist() == [5, 11, 3]
    # pass 3: A commits its canvas; B and C denoise: C's prefix was not disturbed by pass 2's garbage canvas
    out = forward([row(COMMIT, ca), row(DENOISE, cb2, sb), row(DENOISE, cc)])
    a.encode(ca)
    assert out.sampled == [1, 2]
    torch.testing.assert_close(out.logits[0], b.logits(cb2, sb), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits[1], c.logits(cc, None), atol=1e-5, rtol=1e-5)
    # pass 4: A denoises its second canvas at slots [21, 37): the sliding window reaches past its prompt
    ca2 = ids(L)
    out = forward([row(DENOISE, ca2), row(DENOISE, cb2, sb), row(DENOISE, cc)])
    torch.testing.assert_close(out.logits[0], a.logits(ca2, None), atol=1e-5, rtol=1e-5)
    assert cache.lengths[:3] == [21, 11, 3] and cache.lengths_t[:3].tolist() == [21, 11, 3]
    assert counter.frame_count == 1  # R = 4 (3 rows in 4 slots), C' = 64, every pass
    assert not counters["graph_break"]


@torch.no_grad()
def test_lengths_on_the_device_follow_advance_move_and_reset():
    model = tiny_model()
    cache = RowCache(model.get_decoder().shapes, batch=3, capacity=64)
    storage = cache.lengths_t.data_ptr()
    cache.advance([4, 0, 7])
    cache.move(2, 0)
    cache.reset(1)
    assert cache.lengths == [7, 0, 7] and cache.lengths_t.tolist() == [7, 0, 7]
    sub = cache.rows([2])
    sub.begin(1, 5)
    assert sub.lengths == [7]
    sub.advance([5])
    assert cache.lengths_t.tolist() == [7, 0, 12]
    assert cache.lengths_t.data_ptr() == storage  # updated in place: a captured graph reads the same storage


@torch.no_grad()
def test_a_pass_past_the_capacity_bucket_is_refused():
    model = tiny_model()
    cache = RowCache(model.get_decoder().shapes, batch=2, capacity=96)
    forward = RowForward(model, cache, denoise_pass=RowDenoisePass(model, compile=False), capacity=32)
    forward([row(PREFILL, torch.arange(3, 23))])  # 20 committed slots
    with pytest.raises(ValueError, match="needs 36 cache slots, the capacity bucket holds 32"):
        forward([row(DENOISE, torch.arange(3, 3 + L))])


@torch.no_grad()
def test_row_pass_with_inductor_matches_the_eager_row_pass():
    model = tiny_model()
    g = torch.Generator().manual_seed(1)
    outs = []
    for denoise_pass in (RowDenoisePass(model, backend="inductor"), RowDenoisePass(model, compile=False)):
        cache = RowCache(model.get_decoder().shapes, batch=2, capacity=64)
        forward = RowForward(model, cache, denoise_pass=denoise_pass, capacity=32)
        g.manual_seed(1)
        ids = lambda n: torch.randint(3, 128, (n,), generator=g)  # noqa: E731
        forward([row(PREFILL, ids(5)), row(PREFILL, ids(11))])
        canvases = [ids(L), ids(L)]
        first = forward([row(DENOISE, canvases[0]), row(PREFILL, ids(3))]).logits  # R = 2, one row denoising
        outs.append([first, forward([row(DENOISE, canvases[0]), row(DENOISE, canvases[1])]).logits])
    for compiled, eager in zip(*outs):
        torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
