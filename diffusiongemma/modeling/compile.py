"""torch.compile for the model: the whole denoising pass (decoder over the canvas + LM head) as one fixed-shape graph
per batch bucket: `DenoisePass` for lock-step (one shared cache) and `RowDenoisePass` for mixed batching and the
server (rows of a `RowCache`, each at its own length). `generate(compile=True)` and `serve --compile` run their
denoising steps through them; encoder passes (prefill, and the commit of each canvas: one pass per canvas, against
one per denoising step) stay eager.

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

Legend: B batch, H hidden, K kv heads, D head dim, L canvas length, C cache capacity, V vocab.
"""

import copy
import types
from typing import Callable

import torch
from torch import nn

from .cache import BlockDiffusionCache, StaticCacheView


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
        self.mode, self.backend, self.compiled = mode, backend, compile
        self._zeros: dict = {}  # (shape, dtype, device) -> the stand-in for a missing self-conditioning input
        self._graphs: dict = {}  # bucket -> its compiled pass (see `_fn`)

    def _fn(self, *args):
        """Run the pass for these arguments: eagerly, or through the compiled function of their bucket.

        Every bucket gets its own `torch.compile` over its own copy of `eager_pass`'s code object, because dynamo
        keeps its graphs per code object and refuses (fullgraph) past `recompile_limit` (8) of them: a server with
        many row buckets, or a process with several models, would reach it. One code object per bucket holds one graph.
        """
        if not self.compiled:
            return self.eager_pass(*args)
        key = bucket_key(args)
        if key not in self._graphs:
            name = f"{type(self).__name__}_{len(self._graphs)}"
            self._graphs[key] = torch.compile(fresh_method(self, type(self).eager_pass, name), fullgraph=True,
                                              dynamic=False, mode=self.mode, backend=self.backend)
        return self._graphs[key](*args)

    def __deepcopy__(self, memo) -> "DenoisePass":
        """A copy of the model gets its own pass over its own weights (compiled afresh on first use)."""
        return DenoisePass(copy.deepcopy(self.model, memo), self.mode, self.backend, self.compiled)

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

class RowDenoisePass(DenoisePass):
    """The compiled denoising pass of mixed batching, over rows of a `RowCache` (generation/passes.py `RowForward`).

    `pass_fn(canvas, cache, soft, capacity)`: canvas [R, L] of pool rows [0, R) (R the row bucket), each at its own
    committed length S_b (`cache.lengths_t`, on the device), against cache slots [0, C') (C' = `capacity`, the
    capacity bucket) -> logits [R, L, V] fp32. Each row writes its canvas keys/values at slots S_b + [0, L) and
    attends to its last-W-1/whole prefix and its canvas under a per-row static mask (the sets `build_row_masks` gives
    a denoising row). Rows of the bucket that do not denoise this pass compute logits the caller discards.

        canvas [R, L], keys/values [R, K, C', D] per layer (views of [slots, K, C, D]), S [R], soft [R, L, H]
        -> logits [R, L, V] fp32

    One graph per (R, C', the cache's slots and capacity, dtype, device); lengths, canvases, admissions and rows
    leaving change only tensor values.
    """

    def __deepcopy__(self, memo) -> "RowDenoisePass":
        return RowDenoisePass(copy.deepcopy(self.model, memo), self.mode, self.backend, self.compiled)

    def eager_pass(self, canvas: torch.Tensor, keys: tuple, values: tuple, length: torch.Tensor,
                   soft: torch.Tensor, capacity: int) -> torch.Tensor:
        """The traced function: the cache's whole buffers in, viewed [:R, :, :C'] inside the graph."""
        R = canvas.shape[0]
        view = StaticCacheView([k[:R, :, :capacity] for k in keys], [v[:R, :, :capacity] for v in values],
                               length[:R])
        hidden = self.model.denoise(canvas, view, soft)  # [R, L, H]
        return self.model.head(hidden)  # [R, L, V] fp32

    def __call__(self, canvas: torch.Tensor, cache, soft: torch.Tensor, capacity: int) -> torch.Tensor:
        """One denoising pass over pool rows [0, R) of `cache` (a `RowCache` with written buffers).

        Args:
            canvas: [R, L] token ids (rows that do not denoise: any ids).
            soft: [R, L, H] self-conditioning input; zeros for a row on its first step (spec C.9).
            capacity: C', the slots attended (every row's S_b + L must fit in it; the caller checks on the host).
        """
        if any(k is None for k in cache.keys):
            raise ValueError("the compiled row pass needs the row cache's buffers: encode a prompt first")
        if self.mode == "reduce-overhead" and not getattr(cache, "static_marked", False):  # once: they never move
            for t in (*cache.keys, *cache.values, cache.lengths_t):
                torch._dynamo.mark_static_address(t)
            cache.static_marked = True
        return self._fn(canvas, tuple(cache.keys), tuple(cache.values), cache.lengths_t, soft, capacity)


def bucket_key(args: tuple) -> tuple:
    """What selects a graph: every tensor's shape, dtype and device (per-layer buffers: each one's), and the other
    values (the capacity C', None for a missing padding vector)."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return (tuple(a.shape), a.dtype, a.device)
        if isinstance(a, tuple):
            return (len(a), *(one(t) for t in a))
        return a
    return tuple(one(a) for a in args)


def fresh_method(obj, func: Callable, name: str) -> Callable:
    """`func` bound to `obj`, over a new copy of its code object named `name` (dynamo caches graphs per code object)."""
    code = func.__code__.replace(co_name=name, co_qualname=name)
    return types.MethodType(types.FunctionType(code, func.__globals__, name, func.__defaults__, func.__closure__), obj)


def row_bucket(rows: int, slots: int) -> int:
    """The rows R a compiled mixed pass runs for n active rows: the next power of two, at most the pool's slots."""
    return min(1 << (rows - 1).bit_length(), slots)


def capacity_bucket(slots: int, canvas_length: int) -> int:
    """The cache capacity a compiled call reserves for `slots` slots: L times the next power of two of slots / L, so
    calls with other prompt lengths or `max_new_tokens` mostly share a graph (at most twice the slots attended)."""
    blocks = -(-slots // canvas_length)
    return canvas_length * (1 << (blocks - 1).bit_length())


def compiled_denoise_pass(model: nn.Module, mode: str | None = None, backend: str | Callable = "inductor",
                          rows: bool = False) -> DenoisePass:
    """The model's compiled denoising pass for these options: `DenoisePass` (lock-step, `pass_fn(canvas, cache, soft,
    keep)`) or, with `rows`, `RowDenoisePass` (mixed batching and the server). Built on first use and kept on the
    model, so every later `generate(compile=...)` call (and every server pass) reuses its graphs."""
    passes = model.__dict__.setdefault("_denoise_passes", {})
    key = (mode, backend, rows)
    if key not in passes:
        passes[key] = (RowDenoisePass if rows else DenoisePass)(model, mode=mode, backend=backend)
    return passes[key]
