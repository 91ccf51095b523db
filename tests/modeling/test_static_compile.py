"""The fixed-shape denoising pass (modeling/compile.py `DenoisePass`, cache.py `StaticCacheView`, masks.py
`build_static_decoder_masks`): one graph per batch bucket over several canvases and steps, no graph break, no
recompile, and the eager pass's logits."""

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from conftest import tiny_model
from diffusiongemma.modeling.compile import DenoisePass

pytestmark = pytest.mark.usefixtures("one_thread")
L, CANVASES, STEPS = 16, 3, 3


def run_canvases(model, pass_fn, B, padded):
    """Lock-step shape of generate: encode the prompt (then each canvas), STEPS passes per canvas; all logits."""
    g = torch.Generator().manual_seed(B)
    ids = torch.randint(3, 128, (B, 12), generator=g)
    keep = None
    if padded:
        keep = torch.ones(B, 12 + CANVASES * L, dtype=torch.bool)
        keep[0, :3] = False  # row 0 left-padded
    cache = model.new_cache()
    cache.reserve(12 + CANVASES * L)
    out, tokens = [], ids
    with torch.no_grad():
        for c in range(CANVASES):
            model.encode(tokens, cache, keep=keep)
            canvas, soft = torch.randint(0, 128, (B, L), generator=g), None
            for _ in range(STEPS):
                logits = pass_fn(canvas, cache, soft, keep)  # [B, L, V]
                out.append(logits)
                soft = model.get_decoder().soft_embedding(logits)
                canvas = logits.argmax(-1)
            tokens = canvas
    return torch.stack(out)


def exact_pass(model):
    return lambda canvas, cache, soft, keep: model.head(model.denoise(canvas, cache, soft, keep=keep))


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "padding"])
def test_denoise_pass_compiles_once_per_bucket_without_breaks_and_matches_eager(padded):
    model = tiny_model()
    counter = CompileCounter()
    pass_fn = DenoisePass(model, backend=counter)
    counters.clear()
    for B in (1, 2):  # two batch buckets
        compiled = run_canvases(model, pass_fn, B, padded)
        static_eager = run_canvases(model, DenoisePass(model, compile=False), B, padded)
        exact = run_canvases(model, exact_pass(model), B, padded)
        assert torch.equal(compiled, static_eager)  # same ops, the "eager" backend of CompileCounter
        # attending over masked extra slots changes SDPA's reduction order: equal to float rounding only
        torch.testing.assert_close(compiled, exact, atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 2  # one graph per batch bucket, over 3 canvases x 3 steps each
    assert not counters["graph_break"]
    assert not counters["recompiles"]  # no guard failure beyond the new bucket


def test_denoise_pass_with_inductor_matches_eager_pass():
    model = tiny_model()
    pass_fn = DenoisePass(model, backend="inductor")
    counters.clear()
    compiled = run_canvases(model, pass_fn, 2, padded=True)
    exact = run_canvases(model, exact_pass(model), 2, padded=True)
    torch.testing.assert_close(compiled, exact, atol=1e-4, rtol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
