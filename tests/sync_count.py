"""Count host synchronisations: `count_host_syncs()` patches the tensor methods that copy a device value to Python.

A call to `.item()`, `.tolist()`, `bool(t)`, `int(t)`, `float(t)`, `t.nonzero()` / `torch.nonzero(t)` or
`torch.where(cond)` (one argument) makes the host wait for the device on CUDA. On CPU nothing waits, but the same
calls are what would stall a GPU, so counting them on CPU tells where a step would sync. Boolean-mask indexing
(`x[mask]`) also syncs on CUDA and runs in C++, out of reach of this patch: the CUDA tests use
`torch.cuda.set_sync_debug_mode` for that.

    with count_host_syncs() as syncs:
        step(...)
    assert syncs.total == 0, syncs.calls
"""

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero")
_FUNCTIONS = ("nonzero",)


@dataclass
class SyncCounts:
    calls: Counter = field(default_factory=Counter)  # name -> count

    @property
    def total(self) -> int:
        return sum(self.calls.values())


@contextmanager
def count_host_syncs():
    """Yield a `SyncCounts` that counts every host sync made inside the block (any thread)."""
    counts = SyncCounts()
    saved_methods = {name: getattr(torch.Tensor, name) for name in _METHODS}
    saved_functions = {name: getattr(torch, name) for name in _FUNCTIONS}
    saved_where = torch.where

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts.calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    def where(condition, *args, **kwargs):
        if not args and not kwargs:  # torch.where(cond) == cond.nonzero(as_tuple=True)
            counts.calls["where"] += 1
        return saved_where(condition, *args, **kwargs)

    try:
        for name, fn in saved_methods.items():
            setattr(torch.Tensor, name, counted(f"Tensor.{name}", fn))
        for name, fn in saved_functions.items():
            setattr(torch, name, counted(f"torch.{name}", fn))
        torch.where = where
        yield counts
    finally:
        for name, fn in saved_methods.items():
            setattr(torch.Tensor, name, fn)
        for name, fn in saved_functions.items():
            setattr(torch, name, fn)
        torch.where = saved_where
