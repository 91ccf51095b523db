"""KV cache for block diffusion: the committed prefix plus a reserved canvas slot, per layer (spec C.10).

Capacity is static: `reserve(C)` (lock-step generate calls it with the whole generation length) fixes the slots per
layer, and the buffers [B, K, C, D] are allocated once, at the first write, and never move while the cache lives. A
write past the capacity (a `forward` call with no `reserve`) raises the capacity to exactly what it needs.

Encoder passes write their keys/values at slots [S, S+T) and then advance the committed length S. Denoising passes
write the canvas keys/values into the reserved slots [S, S+L) *without* advancing S. The next commit pass overwrites
the same slots. S is kept twice: a host int (`length`, it sizes encoder passes and the exact decoder views) and a
0-d device tensor (`length_t`, updated in place by `advance`, so its storage never moves either).

Denoising passes read the cache one of two ways:

* exact (the default, `BlockDiffusionCache.write`): attention reads the view [kv_start, S+L) of each buffer, sized on
  the host. No per-step concatenation; the shapes (and SDPA's rounding) are the built-in's, so parity is bit-exact.
* static (`static_view()` -> `StaticCacheView`, for the compiled pass of modeling/compile.py): the canvas is written
  at device-side slots S_t + [0, L) and attention reads the whole capacity [0, C); slots not yet written (and the
  sliding layers' dropped ones) are masked by `masks.build_static_decoder_masks` from S_t. Every tensor of the pass
  then has the same shape at every step and canvas, so it compiles once and can be captured as a CUDA graph.

While autograd is recording (training), writes are functional (`torch.cat`) instead of in place, so gradients flow
through the cached keys/values and nothing a backward pass needs is overwritten.

Legend: B batch, K kv heads, C capacity (slots), D head dim, T tokens written, L canvas length, S committed slots.
"""

from dataclasses import dataclass

import torch

from .config import LayerShape
from .host import device_tensor, to_device


class BlockDiffusionCache:
    """Per-layer key/value buffers [B, K, C, D] with a shared committed length.

    Args:
        shapes: the `LayerShape` of every layer (K and D differ between full and sliding layers).
        capacity: static slots C per layer (0: set by `reserve` or by the first write).
    """

    def __init__(self, shapes: list[LayerShape], capacity: int = 0):
        self.shapes = list(shapes)
        self.keys: list[torch.Tensor | None] = [None] * len(shapes)
        self.values: list[torch.Tensor | None] = [None] * len(shapes)
        self.length = 0  # committed slots S, on the host
        self.length_t: torch.Tensor | None = None  # [] long on the buffers' device: S again, for the static pass
        self.capacity = capacity  # slots C of every buffer
        self.padding = None  # `PaddingSlots` of the latest padding vector a denoising pass read (masks.py)

    def __len__(self) -> int:
        return len(self.shapes)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of committed slots S (the canvas slot is not counted)."""
        return self.length

    def reserve(self, slots: int) -> None:
        """Make the static capacity at least `slots` slots, so writes up to there never reallocate.

        Buffers already allocated move once, here, into buffers of the new capacity (their committed slots copied).
        """
        if slots <= self.capacity:
            return
        self.capacity = slots
        for layer, keys in enumerate(self.keys):
            if keys is not None and not keys.requires_grad:
                self._fit(layer, keys)

    def _fit(self, layer: int, like: torch.Tensor) -> None:
        """Buffers [B, K, C, D] for `layer` at the capacity, holding the committed slots of the old ones, if any."""
        B, K, _, D = like.shape
        for store in (self.keys, self.values):
            new = like.new_zeros(B, K, self.capacity, D)  # [B, K, C, D]
            if store[layer] is not None:
                new[:, :, : self.length] = store[layer][:, :, : self.length]
            store[layer] = new
        if self.length_t is None:
            self.length_t = torch.full((), self.length, dtype=torch.long, device=like.device)

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, kv_start: int, persist: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Place key/value [B, K, T, D] at slots [S, S+T) and return the views [B, K, S+T-kv_start, D].

        `persist` is True for encoder passes (the write becomes part of the prefix once `advance` is called) and False
        for denoising passes (the write only lives in the reserved canvas slot).
        """
        end = self.length + key.shape[2]
        if torch.is_grad_enabled() and (key.requires_grad or value.requires_grad):
            keys, values = key, value
            if self.keys[layer] is not None:
                keys = torch.cat([self.keys[layer][:, :, : self.length], key], dim=2)
                values = torch.cat([self.values[layer][:, :, : self.length], value], dim=2)
            if persist:
                self.keys[layer], self.values[layer] = keys, values
            return keys[:, :, kv_start:end], values[:, :, kv_start:end]
        self.reserve(end)  # a no-op within the static capacity
        if self.keys[layer] is None or self.keys[layer].shape[2] != self.capacity:
            self._fit(layer, key)  # the first write (or one after functional, training writes)
        self.keys[layer][:, :, self.length : end] = key
        self.values[layer][:, :, self.length : end] = value
        return self.keys[layer][:, :, kv_start:end], self.values[layer][:, :, kv_start:end]

    def advance(self, tokens: int) -> None:
        """Commit the slots just written by an encoder pass: S += tokens (host and device copy; no host sync)."""
        self.length += tokens
        if self.length_t is not None:
            self.length_t.fill_(self.length)  # in place: a captured graph keeps reading the same storage

    def static_view(self) -> "StaticCacheView":
        """The fixed-shape view a compiled denoising pass reads (see the module docstring). Needs written buffers."""
        if self.length_t is None or any(k is None or k.shape[2] != self.capacity for k in self.keys):
            raise ValueError("the static view needs every layer's buffers at the reserved capacity: `reserve` and "
                             "encode a prompt first (training caches, built functionally, have none)")
        return StaticCacheView(list(self.keys), list(self.values), self.length_t)


@dataclass
class StaticCacheView:
    """A denoising pass's view of a `BlockDiffusionCache` (or of rows of a `RowCache`) with every shape fixed by the
    capacity C.

    Attributes:
        keys, values: per layer, the cache's buffers [B, K, C, D] themselves, or views of them (written in place).
        length: on the device, the committed slots: [] S shared by every row, or [B] S_b per row (a `RowCache`).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: torch.Tensor

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, kv_start: int, persist: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the canvas key/value [B, K, L, D] to slots S + [0, L) (S on the device; per row S_b + [0, L)) and
        return the whole buffers [B, K, C, D]; the static mask hides what the pass must not see (`kv_start` is 0,
        `persist` False)."""
        if self.length.dim() == 0:
            slots = self.length + torch.arange(key.shape[2], device=key.device)  # [L]
            self.keys[layer].index_copy_(2, slots, key)
            self.values[layer].index_copy_(2, slots, value)
            return self.keys[layer], self.values[layer]
        B, K, L, D = key.shape
        slots = self.length[:, None] + torch.arange(L, device=key.device)  # [B, L]
        index = slots[:, None, :, None].expand(B, K, L, D)
        self.keys[layer].scatter_(2, index, key)
        self.values[layer].scatter_(2, index, value)
        return self.keys[layer], self.values[layer]


class RecordingLayerCache:
    """Stand-in for one layer's cache inside an activation-checkpointed layer.

    Under checkpointing a layer runs twice (forward, then the recompute in backward), but the cache must be written
    once. This view reads a fixed prefix (the real cache's keys/values captured before the layer ran) and records the
    layer's write instead of storing it; the caller commits the recorded keys/values to the real cache once. A fresh
    view per run makes the recompute see exactly what the first run saw.

    Args:
        prefix_keys, prefix_values: [B, K, >= S, D] the real cache's buffers for this layer, or None when empty.
        length: committed slots S at capture time.
    """

    def __init__(self, prefix_keys: torch.Tensor | None, prefix_values: torch.Tensor | None, length: int):
        self.prefix_keys, self.prefix_values = prefix_keys, prefix_values
        self.length = length
        self.keys: torch.Tensor | None = None  # [B, K, S+T, D] after `write`
        self.values: torch.Tensor | None = None

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, kv_start: int, persist: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Same contract as `BlockDiffusionCache.write`, always functional (torch.cat)."""
        keys, values = key, value
        if self.prefix_keys is not None and self.length:
            keys = torch.cat([self.prefix_keys[:, :, : self.length], key], dim=2)
            values = torch.cat([self.prefix_values[:, :, : self.length], value], dim=2)
        self.keys, self.values = keys, values
        return keys[:, :, kv_start:], values[:, :, kv_start:]


class RowCache:
    """KV cache for mixed-phase batches: every batch row has its own committed length (spec C.10 per row).

    Rows are independent sequences: row b's token t sits at slot t of row b, there is no left padding, and a pass
    writes row b's T keys/values at slots [S_b, S_b + T). Only the first `q_len_b` of them are real; the rest
    (padding queries of a row with fewer tokens than the pass) land in slots the row has not reached yet, which its
    mask hides and its next pass overwrites. Encoder rows commit their tokens with `advance`, denoising rows do not,
    so their canvas sits in the reserved slots right after their prefix.

    Rows are slots of a pool: `active` rows [0, n) take part in the current pass, `move` compacts the pool when a row
    leaves and `reset` frees a row for the next request. `rows(slots)` is a view of some rows only (the encoder rows
    of a compiled pass, `generation/passes.py`).

    Capacity is static: the buffers [slots, K, C, D] are allocated once, at the first write, and never move. The
    committed lengths are kept twice: host ints (`lengths`: the scheduler decides them, so an eager pass never reads
    them back from the device, a host sync on CUDA; `begin` copies them asynchronously) and a device tensor
    (`lengths_t` [slots] long, updated in place by `advance`/`move`/`reset` with an asynchronous copy), which the
    compiled denoising pass reads (modeling/compile.py `RowDenoisePass` views rows [0, R) and slots [0, C') of the
    buffers and `lengths_t[:R]`).

    Args:
        shapes: the `LayerShape` of every layer.
        batch: pool size (most rows in one pass).
        capacity: slots per row, including room for padding queries (max prompt + new tokens + longest pass).
        device: where the buffers live (the model's device).
    """

    def __init__(self, shapes: list[LayerShape], batch: int, capacity: int, device: torch.device | str = "cpu"):
        self.shapes = list(shapes)
        self.batch, self.capacity = batch, capacity
        self.device = torch.device(device)
        self.keys: list[torch.Tensor | None] = [None] * len(shapes)
        self.values: list[torch.Tensor | None] = [None] * len(shapes)
        self.lengths: list[int] = [0] * batch  # committed slots S_b, on the host
        self.lengths_t = torch.zeros(batch, dtype=torch.long, device=self.device)  # [slots] S_b again, on the device
        self._index: torch.Tensor | None = None  # [n, 1, T, 1] write slots of the current pass
        self._end = 0

    def __len__(self) -> int:
        return len(self.shapes)

    def begin(self, num_rows: int, num_q: int) -> torch.Tensor:
        """Prepare a pass of rows [0, n) writing T = num_q slots each from their committed lengths.

        Returns:
            starts: [n] long on the cache's device, S_b per row. Every layer reads keys up to max(S_b) + T.
        """
        starts = self.lengths[:num_rows]
        self._end = max(starts) + num_q
        if self._end > self.capacity:
            raise ValueError(f"pass needs {self._end} slots, the cache holds {self.capacity}")
        starts_t = device_tensor(starts, torch.long, self.device)  # [n]
        self._index = (starts_t[:, None] + torch.arange(num_q, device=self.device))[:, None, :, None]
        return starts_t

    def _buffers(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s buffers [slots, K, C, D], allocated at the first write (K, D, dtype from `like`)."""
        if self.keys[layer] is None:
            _, K, _, D = like.shape
            self.keys[layer] = like.new_zeros(self.batch, K, self.capacity, D)
            self.values[layer] = like.new_zeros(self.batch, K, self.capacity, D)
        return self.keys[layer], self.values[layer]

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, kv_start: int, persist: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter key/value [n, K, T, D] to each row's slots [S_b, S_b + T); return views [n, K, kv_end-kv_start, D]
        (`persist` is ignored: the caller advances committed lengths per row)."""
        n, K, T, D = key.shape
        keys, values = (buf[:n] for buf in self._buffers(layer, key))
        index = self._index.expand(n, K, T, D)
        keys.scatter_(2, index, key)
        values.scatter_(2, index, value)
        return keys[:, :, kv_start : self._end], values[:, :, kv_start : self._end]

    def advance(self, tokens: list[int]) -> None:
        """Commit tokens per row (0 for denoising rows): S_b += tokens[b] for the first len(tokens) rows."""
        for b, t in enumerate(tokens):
            self.lengths[b] += t
        self._lengths_changed()

    def move(self, src: int, dst: int) -> None:
        """Row `src`'s cache becomes row `dst`'s (compaction when a row leaves the pool)."""
        for store in (self.keys, self.values):
            for buf in store:
                if buf is not None:
                    buf[dst] = buf[src]
        self.lengths[dst] = self.lengths[src]
        self._lengths_changed()

    def reset(self, row: int) -> None:
        """Free a row for a new sequence."""
        self.lengths[row] = 0
        self._lengths_changed()

    def seed(self, row: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Give a freed row a committed prefix: per layer keys/values [K, S, D] (one row of another cache's
        committed slots, without padding) at slots [0, S); S_b = S."""
        S = keys[0].shape[1]
        if S > self.capacity:
            raise ValueError(f"a prefix of {S} slots does not fit the cache's {self.capacity}")
        for layer, (k, v) in enumerate(zip(keys, values)):
            buf_k, buf_v = self._buffers(layer, k[None])
            buf_k[row, :, :S] = k
            buf_v[row, :, :S] = v
        self.lengths[row] = S
        self._lengths_changed()

    def _lengths_changed(self) -> None:
        """Copy the host lengths into `lengths_t`, in place (a captured graph keeps reading the same storage) and
        asynchronously (no host sync)."""
        self.lengths_t.copy_(to_device(torch.tensor(self.lengths, dtype=torch.long), self.device))

    def rows(self, slots: list[int]) -> "RowSubset":
        """A view of the rows `slots` (pool slot numbers) with this cache's pass interface: `run_rows` over it
        reads and writes only those rows (the encoder rows of a compiled mixed pass)."""
        return RowSubset(self, slots)


class RowSubset:
    """Some rows of a `RowCache` (`RowCache.rows`), with its pass interface (`lengths`, `begin`, `write`, `advance`):
    a pass of n' rows reads and writes the pool slots `slots` (gathered reads, index_put writes) and leaves the others
    untouched.

    Args:
        cache: the `RowCache`.
        slots: the pool slots of the n' rows, in the pass's row order.
    """

    def __init__(self, cache: RowCache, slots: list[int]):
        self.cache, self.slots = cache, list(slots)
        self.shapes = cache.shapes
        self._rows: torch.Tensor | None = None  # [n'] slots on the device
        self._positions: torch.Tensor | None = None  # [n', T] write slots of the current pass
        self._end = 0

    def __len__(self) -> int:
        return len(self.shapes)

    @property
    def lengths(self) -> list[int]:
        return [self.cache.lengths[s] for s in self.slots]

    def begin(self, num_rows: int, num_q: int) -> torch.Tensor:
        """As `RowCache.begin`, for the rows of this view (num_rows must be all of them)."""
        if num_rows != len(self.slots):
            raise ValueError(f"a pass over this row view needs its {len(self.slots)} rows, got {num_rows}")
        starts = self.lengths
        self._end = max(starts) + num_q
        if self._end > self.cache.capacity:
            raise ValueError(f"pass needs {self._end} slots, the cache holds {self.cache.capacity}")
        device = self.cache.device
        starts_t = device_tensor(starts, torch.long, device)  # [n']
        self._rows = device_tensor(self.slots, torch.long, device)  # [n']
        self._positions = starts_t[:, None] + torch.arange(num_q, device=device)  # [n', T]
        return starts_t

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, kv_start: int, persist: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Put key/value [n', K, T, D] at each row's slots [S_b, S_b + T); return the rows' gathered keys/values
        [n', K, kv_end-kv_start, D]."""
        keys, values = self.cache._buffers(layer, key)
        rows = self._rows[:, None]  # [n', 1]
        keys[rows, :, self._positions] = key.transpose(1, 2)  # indexed [n', T, K, D]
        values[rows, :, self._positions] = value.transpose(1, 2)
        return keys[self._rows, :, kv_start : self._end], values[self._rows, :, kv_start : self._end]

    def advance(self, tokens: list[int]) -> None:
        """Commit tokens per row of the view."""
        for s, t in zip(self.slots, tokens):
            self.cache.lengths[s] += t
        self.cache._lengths_changed()
