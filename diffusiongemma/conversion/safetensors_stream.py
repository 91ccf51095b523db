"""Write safetensors shards whose layout is fixed before any tensor is read, so tensors stream straight to disk.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte offsets) and
the raw C-order bytes. The converter knows every output's name, shape and dtype from the config before reading the
checkpoint, so it writes each shard's header first and then appends each tensor's bytes, slice by slice, as they are
produced: no shard is ever held in memory (`safetensors.torch.save_file` needs the whole shard as a dict). The files
are the ones `save_file` writes (same header fields, `{"format": "pt"}` metadata, header padded to 8 bytes); the
tests read them back with `safetensors` and load them with transformers. Shards are filled greedily in writing order,
as `huggingface_hub.split_torch_state_dict_into_shards` does, and named as transformers names them.
"""

import json
import os
import re
import struct
from dataclasses import dataclass, field

__all__ = ["DTYPE_NAMES", "ShardedWriter", "TensorEntry", "parse_size", "plan_shards"]

# torch dtype name -> safetensors dtype tag and item size
DTYPE_NAMES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text) -> int:
    """'5GB' -> 5 * 10**9, '500MiB' -> 500 * 2**20, 1000 -> 1000 (transformers' `max_shard_size` units)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if not match or match.group(2).upper() not in _UNITS:
            raise ValueError(f"--max-shard-size must be a size like 5GB, 500MB or 2GiB, got {text!r}")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise ValueError(f"--max-shard-size must be > 0, got {text!r}")
    return value


@dataclass(frozen=True)
class TensorEntry:
    key: str
    shape: tuple
    dtype: str  # "bfloat16" | "float16" | "float32"

    @property
    def nbytes(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count * DTYPE_NAMES[self.dtype][1]


def plan_shards(entries: list[TensorEntry], max_shard_bytes: int) -> list[list[TensorEntry]]:
    """Group `entries` (in order) into shards of at most `max_shard_bytes`; a bigger tensor gets a shard alone."""
    shards, current, size = [], [], 0
    for entry in entries:
        if current and size + entry.nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry.nbytes
    if current:
        shards.append(current)
    return shards


def shard_file_names(count: int) -> list[str]:
    return [SINGLE_NAME] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def _header(entries: list[TensorEntry]) -> bytes:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for entry in entries:
        header[entry.key] = {"dtype": DTYPE_NAMES[entry.dtype][0], "shape": list(entry.shape),
                             "data_offsets": [offset, offset + entry.nbytes]}
        offset += entry.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(raw)) + raw


@dataclass
class ShardedWriter:
    """Writes `shards` (from `plan_shards`) into `folder`: `begin(key)`, `write(bytes-like)` until the tensor is
    complete, next key, ..., then `finish(total_parameters)` writes the index (when there is more than one shard).

    Tensors must arrive in planned order with exactly their planned byte count; anything else raises RuntimeError.
    """

    folder: str
    shards: list
    _files: list = field(default_factory=list)
    _shard: int = -1
    _queue: list = field(default_factory=list)
    _left: int = 0
    _handle: object = None

    def __post_init__(self):
        self._files = shard_file_names(len(self.shards))

    def begin(self, key: str) -> None:
        if self._left:
            raise RuntimeError(f"{self._queue[0].key if self._queue else '?'}: {self._left} bytes still unwritten")
        if not self._queue:
            self._next_shard()
        entry = self._queue.pop(0)
        if entry.key != key:
            raise RuntimeError(f"expected tensor {entry.key} next, got {key}")
        self._left = entry.nbytes

    def _next_shard(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self._shard += 1
        if self._shard >= len(self.shards):
            raise RuntimeError("more tensors than planned")
        self._queue = list(self.shards[self._shard])
        self._handle = open(os.path.join(self.folder, self._files[self._shard]), "wb")
        self._handle.write(_header(self._queue))

    def write(self, data) -> None:
        size = memoryview(data).nbytes
        if size > self._left:
            raise RuntimeError(f"{size} bytes written past the end of the current tensor ({self._left} left)")
        self._handle.write(data)
        self._left -= size

    def finish(self, total_parameters: int) -> dict:
        """Close the last shard, write the index; returns {key: file name}."""
        if self._left or self._queue or self._shard != len(self.shards) - 1:
            raise RuntimeError("conversion ended before every planned tensor was written")
        self._handle.close()
        weight_map = {e.key: name for entries, name in zip(self.shards, self._files) for e in entries}
        if len(self.shards) > 1:
            total = sum(e.nbytes for entries in self.shards for e in entries)
            index = {"metadata": {"total_parameters": total_parameters, "total_size": total},
                     "weight_map": weight_map}
            with open(os.path.join(self.folder, INDEX_NAME), "w", encoding="utf-8") as f:
                f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
        return weight_map

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
