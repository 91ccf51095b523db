"""torch.compile for the decoder layers: every layer's work compiled, the KV-cache write left eager.

A layer runs four pieces; `compile_layers` compiles each of them, per layer instance:

    input_layernorm.forward   x [B, T, H] -> [B, T, H]
    self_attn.project         -> q [B, N, T, D], k/v [B, K, T, D]
    (cache.write)             eager: the cache keeps Python state (committed length, capacity) and writes in place
    self_attn.attend          q, cached k/v [B, K, KV, D], the finished mask -> [B, T, H]  (flex: the fused kernel)
    feed_forward              residual, dense MLP, router, routed experts (one grouped GEMM), layer scalar

The write sits between `project` and `attend` because its Python state changes every canvas and every layer; inside a
graph it would be a guard that recompiles. The pieces see only tensors, the finished mask and the backend name, so one
graph per piece serves every layer of the same geometry (sliding or full), every canvas and every step.

What compiles, and when. Shapes change per pass (T is the prompt or the canvas length, KV grows with every committed
canvas), so the pieces are compiled with `dynamic=True`: one graph per piece, layer geometry and mask kind (dense,
`BlockMask`, none) covers every length, and everything a generate call needs is compiled during its first canvas.
Sizes 0 and 1 stay specialized (batch 1 and batch > 1 are separate graphs), and so is grad mode (calling the model
outside `torch.no_grad()` compiles a second, differentiable set). `attend` compiles with duck shaping off: the first
encoder pass has an empty cache (KV == T), and a graph that assumed KV == T would recompile on the second canvas.
Its graphs also depend on whether the cached keys are contiguous, which they are when the view fills its buffer
exactly (the last canvas of a call); so the first time `attend` meets a new kind of input it also runs once on a copy
in the other layout, and both graphs exist before the second canvas.

Legend: B batch, T tokens in this pass, KV keys attended, H hidden, N query heads, K kv heads, D head dim.
"""

from typing import Callable

import torch
import torch.fx.experimental._config as shape_config
from torch import nn

PIECES = (  # (path from the layer to the module, method name)
    ("input_layernorm", "forward"),
    ("self_attn", "project"),
    ("self_attn", "attend"),
    ("", "feed_forward"),
)
# Graphs one piece may need: 2 geometries x 2 mask kinds x batch 1 or more x 2 cache layouts, twice for grad mode.
RECOMPILE_LIMIT = 32


def _layers(model: nn.Module) -> nn.ModuleList:
    stack = model.get_decoder() if hasattr(model, "get_decoder") else model  # the model or its text stack
    return stack.layers


def without_duck_shapes(fn: Callable) -> Callable:
    """`fn` called with dynamo's duck shaping off, so sizes that happen to be equal get separate symbols."""

    def call(*args):
        previous = shape_config.use_duck_shape
        shape_config.use_duck_shape = False
        try:
            return fn(*args)
        finally:
            shape_config.use_duck_shape = previous

    return call


def with_cpu_flex_fallback(compiled: Callable, eager: Callable) -> Callable:
    """`attend` compiled, except flex passes with a `BlockMask` on CPU, which run eagerly.

    torch 2.13's CPU flex template emits C++ that does not compile for a mask_mod closing over more than one symbolic
    int, as the encoder masks do (causal and sliding window over cache slots). Denoising passes without padding have
    no mask and stay compiled; CUDA uses the Triton template.
    """

    def attend(q, k, v, mask, attention_backend):
        if attention_backend == "flex" and mask is not None and q.device.type == "cpu":
            return eager(q, k, v, mask, attention_backend)
        return compiled(q, k, v, mask, attention_backend)

    return attend


def other_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of cached keys/values [B, K, KV, D] in the other memory layout: contiguous <-> a view of a longer buffer."""
    if not t.is_contiguous():
        return t.contiguous()
    B, K, KV, D = t.shape
    return t.new_empty(B, K, KV + 1, D)[:, :, :KV].copy_(t)


def unviewed(t: torch.Tensor) -> torch.Tensor:
    """The same memory as a tensor that is not a view (no autograd history to keep): dynamo guards a view's base
    too, and the cache's views would then need graphs that a plain tensor of the same layout does not."""
    return t if t.requires_grad else t.detach()


def with_both_layouts_compiled(compiled: Callable) -> Callable:
    """`attend` that compiles the graph for the other key/value layout too, the first time it meets a kind of input.

    Graphs are specialized on whether the cached keys/values are contiguous. They are only when the view fills its
    buffer exactly (the last canvas of a call), so without this the last canvas would compile again.
    """
    seen = set()

    def attend(q, k, v, mask, attention_backend):
        k, v = unviewed(k), unviewed(v)
        kind = (q.shape[0] == 1, q.shape[1], k.shape[1], q.shape[3], q.dtype, type(mask), torch.is_grad_enabled())
        if kind not in seen:
            seen.add(kind)
            compiled(q, unviewed(other_layout(k)), unviewed(other_layout(v)), mask, attention_backend)  # compiles
        return compiled(q, k, v, mask, attention_backend)

    return attend


def compiled_piece(name: str, eager: Callable, mode: str | None, dynamic: bool | None, backend) -> Callable:
    """The compiled stand-in for the eager method `name` of one layer."""
    compiled = torch.compile(eager, mode=mode, dynamic=dynamic, backend=backend, recompile_limit=RECOMPILE_LIMIT)
    if name == "attend":
        return with_cpu_flex_fallback(with_both_layouts_compiled(without_duck_shapes(compiled)), eager)
    return compiled


def uncompile_layers(model: nn.Module) -> nn.Module:
    """Undo `compile_layers`: every piece runs its eager method again. Returns the model."""
    for layer in _layers(model):
        for path, name in PIECES:
            vars(layer.get_submodule(path)).pop(name, None)
    model._compiled_layers = None
    return model


def compile_layers(
    model: nn.Module, mode: str | None = None, dynamic: bool | None = True, backend: str | Callable = "inductor"
) -> nn.Module:
    """Compile the per-step work of every decoder layer with `torch.compile`, in place; returns the model.

    Parameters, buffers, the cache and every other method stay as they are; only the four pieces listed in the module
    docstring are replaced by compiled versions (instance attributes, so `state_dict`, hooks and saving are
    unaffected). Compilation happens lazily, during the first passes. Calling it again with the same arguments does
    nothing; with other arguments it compiles afresh from the eager methods. `uncompile_layers` undoes it.

    Args:
        model: a `DiffusionGemmaForBlockDiffusion` (or its text stack).
        mode: `torch.compile` mode: None (default) or e.g. "max-autotune-no-cudagraphs". CUDA-graph modes
            ("reduce-overhead") are untested: the cache writes between the pieces happen outside the graphs.
        dynamic: `torch.compile`'s `dynamic`. True (default): every piece compiles once for all prompt, canvas and
            cache lengths. None: static first, recompiled with dynamic shapes when a length changes. False: a
            compilation for every new length, until the recompile limit sends the piece back to eager.
        backend: `torch.compile`'s `backend`: "inductor" (default), "aot_eager" to bisect a numerical difference, or
            a callable (the tests count compilations with one).
    Returns:
        the same model.
    """
    settings = (mode, dynamic, backend)
    if getattr(model, "_compiled_layers", None) == settings:
        return model
    uncompile_layers(model)
    for layer in _layers(model):
        for path, name in PIECES:
            module = layer.get_submodule(path)
            setattr(module, name, compiled_piece(name, getattr(module, name), mode, dynamic, backend))
    model._compiled_layers = settings
    return model
