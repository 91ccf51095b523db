"""The compiled denoising pass on CUDA (modeling/compile.py `DenoisePass`, `generate(compile=...)`): tokens as
eager's, one graph for every step and canvas, and CUDA-graph replay (mode="reduce-overhead")."""

import pytest
import torch

from conftest import tiny_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["inductor", "cuda-graphs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_compiled_pass_matches_eager_on_cuda(dtype, mode):
    model = tiny_model().to("cuda", dtype)
    ids = torch.randint(3, 128, (2, 20), generator=torch.Generator().manual_seed(0)).cuda()
    kw = dict(sampling="fast", seed=0, max_new_tokens=48, max_denoising_steps=3)
    eager = model.generate(ids, **kw)
    model.generate(ids, compile={"mode": mode}, **kw)  # compiles
    torch._dynamo.utils.counters.clear()
    compiled = model.generate(ids, compile={"mode": mode}, **kw)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0, "a second call compiled new graphs"
    assert not torch._dynamo.utils.counters["graph_break"]
    if dtype == torch.float32:
        assert torch.equal(compiled.sequences, eager.sequences)
