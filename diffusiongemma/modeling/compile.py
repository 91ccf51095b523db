"""torch.compile for the model: the decoder layers piece by piece (`compile_layers`), or the whole denoising pass as
one fixed-shape graph (`DenoisePass`).

## compile_layers

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
(`DenoisePass` below needs no such switch: its shapes are static.)
Its graphs also depend on whether the cached keys are contiguous, which they are when the view fills its buffer
exactly (the last canvas of a call); so the first time `attend` meets a new kind of input it also runs once on a copy
in the other layout, and both graphs exist before the second canvas.

## DenoisePass

`DenoisePass(model)(canvas, cache, soft, keep)` is decoder + LM head over the canvas, compiled with
`torch.compile(fullgraph=True, dynamic=False)`: one graph, no graph break, and no recompile across steps and canvases.
It reads the cache through `cache.static_view()` (modeling/cache.py): the canvas keys/values go to the device-side
slots S_t + [0, L), attention reads all C slots under a mask built from S_t (masks.build_static_decoder_masks), so

    canvas [B, L], keys/values [B, K, C, D] per layer, S_t [], soft [B, L, H], keep [B, C] -> logits [B, L, V] fp32

have the same shapes and addresses at every step and canvas. What selects a graph (the bucket) is what the shapes
are made of: B, L, C, dtype, device, and whether a padding vector is passed; a missing self-conditioning input is
replaced by zeros, which gives exactly the first-step embedding (spec C.9: the MLP of zeros is 0), so steps 1 and 2
share the graph. With mode="reduce-overhead" the buffers are marked static addresses and the pass replays as a
CUDA graph; a new cache (another generate call) then records a graph for its own buffers.

Legend: B batch, T tokens in this pass, KV keys attended, H hidden, N query heads, K kv heads, D head dim,
L canvas length, C cache capacity, V vocab.
"""

from typing import Callable

import torch
import torch.fx.experimental._config as shape_config
from torch import nn

from .cache import BlockDiffusionCache, StaticCacheView

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
    """`fn` called with dynamo's duck shaping off, so sizes that happen to be equal get separate symbols.

    TODO(issue 24): process-wide while `fn` runs. Marking KV dynamic on the tensors (`maybe_mark_dynamic`) is not
    enough: the cached keys' strides are still duck-shaped and the second canvas recompiles `attend` on a stride guard.
    """

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


class DenoisePass:
    """Decoder over the canvas + LM head as one compiled, fixed-shape graph per bucket (see the module docstring).

    Args:
        model: a `DiffusionGemmaForBlockDiffusion`.
        mode: `torch.compile` mode: None, "reduce-overhead" (CUDA graphs) or "max-autotune-no-cudagraphs".
        backend: `torch.compile` backend: "inductor", "aot_eager", "eager" or a callable (tests count graphs).
        compile: False runs the same fixed-shape pass eagerly (the reference for the compiled one).

    Call it once per denoising step: `logits = pass_fn(canvas, cache, soft, keep)`.
    """

    def __init__(self, model: nn.Module, mode: str | None = None, backend: str | Callable = "inductor",
                 compile: bool = True):
        self.model = model
        self.mode = mode
        self._zeros: dict = {}  # (shape, dtype, device) -> the stand-in for a missing self-conditioning input
        self._fn = self.eager_pass
        if compile:
            self._fn = torch.compile(self.eager_pass, fullgraph=True, dynamic=False, mode=mode, backend=backend)

    def eager_pass(self, canvas: torch.Tensor, keys: tuple, values: tuple, length: torch.Tensor,
                   soft: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """The traced function: tensors in, logits [B, L, V] fp32 out; the canvas keys/values land in `keys`/`values`."""
        view = StaticCacheView(list(keys), list(values), length)
        hidden = self.model.denoise(canvas, view, soft, keep=keep)  # [B, L, H]
        return self.model.head(hidden)  # [B, L, V] fp32

    def __call__(self, canvas: torch.Tensor, cache: BlockDiffusionCache, soft: torch.Tensor | None = None,
                 keep: torch.Tensor | None = None) -> torch.Tensor:
        """One denoising pass: canvas [B, L] at slots [S, S+L) of `cache` -> logits [B, L, V] fp32.

        Args:
            canvas: [B, L] token ids.
            cache: a `BlockDiffusionCache` holding the committed prefix, its capacity reserved (`reserve`) and its
                buffers written by an encoder pass; the pass writes only the canvas slots and never advances it.
            soft: self-conditioning input [B, L, H] (`soft_embedding`), or None on the first step.
            keep: [B, slots] bool padding vector (slots >= S; cut or extended to the capacity), or None.
        Returns:
            logits [B, L, V] fp32, soft-capped (what `model.head(model.denoise(...))` returns).
        """
        view = cache.static_view()
        if soft is None:
            B, L = canvas.shape
            dtype = self.model.get_decoder().embed_tokens.weight.dtype
            key = (B, L, dtype, canvas.device)
            if key not in self._zeros:
                self._zeros[key] = torch.zeros(B, L, self.model.config.text_config.hidden_size, dtype=dtype,
                                               device=canvas.device)
            soft = self._zeros[key]
        if self.mode == "reduce-overhead":  # CUDA graphs replay at fixed addresses: mutated inputs must be static ones
            for t in (*view.keys, *view.values, view.length):
                torch._dynamo.mark_static_address(t)
        return self._fn(canvas, tuple(view.keys), tuple(view.values), view.length, soft, keep)

def compiled_denoise_pass(model: nn.Module, mode: str | None = None, backend: str | Callable = "inductor"
                          ) -> DenoisePass:
    """`DenoisePass(model, mode, backend)`: the compiled denoising pass, `pass_fn(canvas, cache, soft, keep)`."""
    return DenoisePass(model, mode=mode, backend=backend)
