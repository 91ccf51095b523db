"""`generate` keeps at most two fp32 [B, L, V] buffers alive at once (issue: another engine ran out of memory with six);
in fact one: the logits, which reference mode turns into the probabilities in place and fast mode walks in blocks.

A dispatch mode watches every tensor that torch ops produce and records the peak number of distinct live storages of
at least B*L*V elements. The vocabulary is large enough that the samplers' row blocks are far smaller than that.
"""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conftest import tiny_config, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
B, L, V = 4, 32, 32768


class LargeBuffers(TorchDispatchMode):
    def __init__(self, numel: int, element_size: int = 4):
        super().__init__()
        self.bytes, self.tensors, self.peak = numel * element_size, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() >= self.bytes:
                self.tensors.append(weakref.ref(t))
        alive = [r() for r in self.tensors]
        self.tensors = [r for r, t in zip(self.tensors, alive) if t is not None]
        self.peak = max(self.peak, len({t.untyped_storage().data_ptr() for t in alive if t is not None}))
        return out


@pytest.fixture(scope="module")
def model():
    return tiny_model(tiny_config(vocab_size=V, canvas_length=L))


@pytest.fixture(scope="module")
def bf16_model(model):
    return tiny_model(tiny_config(vocab_size=V, canvas_length=L)).to(torch.bfloat16)


@pytest.mark.parametrize("mode", ["reference", "fast"])
def test_bf16_at_most_two_vocabulary_sized_buffers(bf16_model, mode):
    """In bf16 (the checkpoints' dtype) the LM head writes a bf16 [B, L, V] that becomes the fp32 logits: counting
    every [B, L, V] buffer of 2 bytes or more per element, at most those two are alive at once."""
    ids = torch.randint(3, V, (B, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(seed=0) if mode == "fast" else {}
    with torch.no_grad(), LargeBuffers(B * L * V, element_size=2) as watch:
        out = bf16_model.generate(ids, sampling=mode, max_new_tokens=2 * L, max_denoising_steps=3, batching=None,
                                  **kw)
    assert out.sequences.shape == (B, 5 + 2 * L)
    assert watch.peak <= 2, watch.peak


@pytest.mark.parametrize("mode", ["reference", "fast"])
def test_at_most_two_vocabulary_sized_buffers(model, mode):
    assert model.lm_head.weight.numel() < B * L * V  # only [B, L, V]-sized tensors are counted
    ids = torch.randint(3, V, (B, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(seed=0) if mode == "fast" else {}
    with torch.no_grad(), LargeBuffers(B * L * V) as watch:
        model.generate(ids, sampling=mode, max_new_tokens=2 * L, max_denoising_steps=3, batching=None, **kw)
    assert watch.peak == 1  # the logits; reference mode turns them into the probabilities in place
