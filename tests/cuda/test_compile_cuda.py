"""torch.compile of the decoder layers on CUDA (modeling/compile.py): compiled logits and tokens equal eager's, and
later canvases compile nothing new."""

import pytest
import torch

from conftest import tiny_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_compiled_layers_match_eager_on_cuda(dtype):
    model = tiny_model().to("cuda", dtype)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (2, 20), generator=g).cuda()
    canvas = torch.randint(0, 128, (2, 16), generator=g).cuda()

    def run():
        with torch.no_grad():
            out = model(input_ids=ids, decoder_input_ids=canvas).logits
        tokens = model.generate(ids, sampling="fast", seed=0, max_new_tokens=48, max_denoising_steps=3).sequences
        return out, tokens

    eager_logits, eager_tokens = run()
    model.generate(ids, compile=True, sampling="fast", seed=0, max_new_tokens=16, max_denoising_steps=3)  # compiles
    torch._dynamo.utils.counters.clear()
    compiled_logits, compiled_tokens = run()
    new_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    diff = (compiled_logits - eager_logits).abs().max().item()
    assert diff <= (1e-4 if dtype == torch.float32 else 0.15), f"compiled vs eager logits differ by {diff}"
    if dtype == torch.float32:
        assert torch.equal(compiled_tokens, eager_tokens)
    assert new_graphs == 0, "a second call with more canvases compiled new graphs"
