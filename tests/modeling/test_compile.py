"""Compiled decoder layers (modeling/compile.py): eager's logits and tokens, every graph compiled during the first
canvas, and the opaque grouped GEMM that lets the MoE compile in fp32."""

import pytest
import torch
from torch._inductor.compile_fx import compile_fx

from conftest import tiny_config, tiny_model
from diffusiongemma.modeling.compile import PIECES, compile_layers, uncompile_layers
from diffusiongemma.modeling.moe import opaque_grouped_mm

GRAPHS = []  # every graph compiled through `counting_inductor`, across tests (they share compiled code)


def counting_inductor(gm, example_inputs):
    GRAPHS.append(gm)
    return compile_fx(gm, example_inputs)


class GraphsPerCanvas:
    """A streamer recording how many graphs exist at each `put`: after the prompt, then after every canvas."""

    def __init__(self):
        self.graphs = []

    def put(self, value):
        self.graphs.append(len(GRAPHS))

    def end(self):
        pass


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # CPU encoder passes, see compile.py
@pytest.mark.parametrize("impl", ["sdpa", "flex_attention"])
def test_compiled_layers_give_eager_logits_and_tokens_and_compile_only_in_the_first_canvas(impl, one_thread):
    config = tiny_config()
    config._attn_implementation = impl
    model = tiny_model(config)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (1, 20), generator=g)  # longer than the window (8): sliding layers drop slots
    canvas = torch.randint(0, 128, (1, 16), generator=g)

    def logits():
        with torch.no_grad():
            first = model(input_ids=ids, decoder_input_ids=canvas)  # encoder pass, then a denoising pass
            again = model(past_key_values=first.past_key_values, decoder_input_ids=canvas,
                          self_conditioning_logits=first.logits)
        return torch.cat([first.logits, again.logits])

    def tokens(new_tokens, streamer=None):
        return model.generate(ids, sampling="fast", seed=0, max_new_tokens=new_tokens, max_denoising_steps=3,
                              streamer=streamer).sequences

    eager_logits, eager_tokens = logits(), tokens(48)
    compile_layers(model, backend=counting_inductor)
    per_canvas = GraphsPerCanvas()
    compiled_tokens = tokens(48, per_canvas)  # 3 canvases of 16
    after_first_canvas = per_canvas.graphs[1]
    assert after_first_canvas > per_canvas.graphs[0]  # compiled lazily, by the first canvas
    assert per_canvas.graphs[1:] == [after_first_canvas] * 3  # canvases 2 and 3 compile nothing
    assert torch.equal(compiled_tokens, eager_tokens)
    torch.testing.assert_close(logits(), eager_logits, atol=1e-4, rtol=0)
    tokens(64)  # a second call with more canvases (and a longer cache), then one exactly filling its cache
    tokens(16)
    assert len(GRAPHS) == after_first_canvas


def test_compile_layers_is_idempotent_and_undone_by_uncompile_layers():
    model = tiny_model()
    keys = set(model.state_dict())
    layer = model.model.decoder.layers[0]
    assert compile_layers(model, backend="eager") is model  # compiles lazily: nothing runs here
    pieces = [vars(layer.get_submodule(path))[name] for path, name in PIECES]
    compile_layers(model, backend="eager")
    assert [vars(layer.get_submodule(path))[name] for path, name in PIECES] == pieces
    assert set(model.state_dict()) == keys
    uncompile_layers(model)
    assert not any(name in vars(layer.get_submodule(path)) for path, name in PIECES)


def test_opaque_grouped_mm_matches_grouped_mm_with_gradients_and_traces():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(10, 8, generator=g, requires_grad=True)  # 10 rows sorted by expert
    w = torch.randn(3, 12, 8, generator=g, requires_grad=True)  # 3 experts, [E, N, K] as the checkpoint stores them
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)  # expert 1 gets no rows
    expected = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    got = opaque_grouped_mm(a, w.transpose(-2, -1), offs)
    assert torch.equal(got, expected)
    up = torch.randn(expected.shape, generator=g)
    for x, y in zip(torch.autograd.grad(got, (a, w), up), torch.autograd.grad(expected, (a, w), up)):
        torch.testing.assert_close(x, y)
    torch.library.opcheck(opaque_grouped_mm, (a, w.transpose(-2, -1), offs))  # fake impl, autograd, AOT tracing
