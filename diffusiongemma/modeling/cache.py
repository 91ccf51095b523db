"""KV cache for block diffusion: the committed prefix plus a reserved canvas slot, per layer (spec C.10).

Encoder passes write their keys/values at slots [S, S+T) and then advance the committed length S. Denoising passes
write the canvas keys/values into the reserved slots [S, S+L) *without* advancing S, so attention reads a view
[kv_start, S+L) of one buffer: no per-step concatenation of the whole prefix with the canvas. The next commit pass
overwrites the same slots. Sliding layers read only the last W-1 committed slots (the mask builder picks the view).

While autograd is recording (training), writes are functional (`torch.cat`) instead of in place, so gradients flow
through the cached keys/values and nothing a backward pass needs is overwritten.

Legend: B batch, K kv heads, C capacity (slots), D head dim, T tokens written.
"""

import torch

from .config import LayerShape
from .host import device_tensor


class BlockDiffusionCache:
    """Per-layer key/value buffers [B, K, C, D] with a shared committed length.

    Args:
        shapes: the `LayerShape` of every layer (K and D differ between full and sliding layers).
    """

    def __init__(self, shapes: list[LayerShape]):
        self.shapes = list(shapes)
        self.keys: list[torch.Tensor | None] = [None] * len(shapes)
        self.values: list[torch.Tensor | None] = [None] * len(shapes)
        self.length = 0  # committed slots S
        self.capacity_hint = 0
        self.padding = None  # `PaddingSlots` of the latest padding vector a denoising pass read (masks.py)

    def __len__(self) -> int:
        return len(self.shapes)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of committed slots S (the canvas slot is not counted)."""
        return self.length

    def reserve(self, slots: int) -> None:
        """Ask for room for `slots` slots in total, so writes up to there never reallocate."""
        self.capacity_hint = max(self.capacity_hint, slots)

    def _grow(self, layer: int, needed: int, like: torch.Tensor) -> None:
        buf = self.keys[layer]
        capacity = 0 if buf is None else buf.shape[2]
        if needed <= capacity:
            return
        new_capacity = max(needed, self.capacity_hint, 2 * capacity)
        B, K, _, D = like.shape
        for store in (self.keys, self.values):
            new = like.new_zeros(B, K, new_capacity, D)
            if store[layer] is not None:
                new[:, :, : self.length] = store[layer][:, :, : self.length]
            store[layer] = new

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
        self._grow(layer, end, key)
        self.keys[layer][:, :, self.length : end] = key
        self.values[layer][:, :, self.length : end] = value
        return self.keys[layer][:, :, kv_start:end], self.values[layer][:, :, kv_start:end]

    def advance(self, tokens: int) -> None:
        """Commit the slots just written by an encoder pass: S += tokens."""
        self.length += tokens


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
    leaves and `reset` frees a row for the next request.

    The committed lengths are host ints: the scheduler decides them, so a pass never reads them back from the device
    (a host sync on CUDA); `begin` copies them to the device asynchronously.

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

    def write(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, kv_start: int, persist: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter key/value [n, K, T, D] to each row's slots [S_b, S_b + T); return views [n, K, kv_end-kv_start, D]
        (`persist` is ignored: the caller advances committed lengths per row)."""
        n, K, T, D = key.shape
        if self.keys[layer] is None:
            self.keys[layer] = key.new_zeros(self.batch, K, self.capacity, D)
            self.values[layer] = value.new_zeros(self.batch, K, self.capacity, D)
        index = self._index.expand(n, K, T, D)
        keys, values = self.keys[layer][:n], self.values[layer][:n]
        keys.scatter_(2, index, key)
        values.scatter_(2, index, value)
        return keys[:, :, kv_start : self._end], values[:, :, kv_start : self._end]

    def advance(self, tokens: list[int]) -> None:
        """Commit tokens per row (0 for denoising rows): S_b += tokens[b] for the first len(tokens) rows."""
        for b, t in enumerate(tokens):
            self.lengths[b] += t

    def move(self, src: int, dst: int) -> None:
        """Row `src`'s cache becomes row `dst`'s (compaction when a row leaves the pool)."""
        for store in (self.keys, self.values):
            for buf in store:
                if buf is not None:
                    buf[dst] = buf[src]
        self.lengths[dst] = self.lengths[src]

    def reset(self, row: int) -> None:
        """Free a row for a new sequence."""
        self.lengths[row] = 0
