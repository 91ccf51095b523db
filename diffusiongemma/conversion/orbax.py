"""Read an Orbax PyTree checkpoint one array (or one slice of an array) at a time, with TensorStore.

Orbax writes `<ckpt>/_METADATA` (JSON: each leaf's key path as a Python-literal tuple, spec G) and stores every
array as a zarr array named by its dotted key path, either inside one OCDBT database (the default since Orbax 0.5)
or in its own folder. We read that layout directly with TensorStore, the library Orbax itself reads with, so a
conversion never restores the whole tree and never imports JAX: a read asks TensorStore for exactly the selection
it needs (`ArrayReader.read(select)`), and a stacked array read layer by layer keeps its decoded chunk in a cache
bounded by the array's own size. `tests/conversion` checks the spec we build against Orbax's own
(`orbax.checkpoint.type_handlers.get_json_tspec_read`) on checkpoints Orbax wrote.
"""

import ast
import contextlib
import json
import os
from dataclasses import dataclass

__all__ = ["INSTALL_HINT", "CheckpointReadError", "OrbaxArray", "OrbaxCheckpoint", "read_spec", "require_tensorstore"]

INSTALL_HINT = ('pip install "diffusiongemma[convert]"  (from a checkout: pip install -e ".[convert]"; it installs '
                "orbax-checkpoint, tensorstore, zstandard and jax for CPU at the tested versions)")
ARRAY_TYPES = ("np.ndarray", "jax.Array", "jax.numpy.ndarray", "scalar")  # _METADATA value types stored as zarr
METADATA_CACHE_BYTES = 64 * 2**20  # OCDBT b-tree nodes, shared by every array


def require_tensorstore():
    """Import TensorStore (with NumPy), or raise ImportError saying exactly what to install."""
    try:
        import numpy  # noqa: F401
        import tensorstore
    except ImportError as error:
        raise ImportError(f"converting an Orbax checkpoint needs TensorStore ({error}); install it with: "
                          f"{INSTALL_HINT}") from None
    return tensorstore


@dataclass(frozen=True)
class OrbaxArray:
    """One stored array: its path below `params/` ("transformer/layer_0/attn/q_einsum/w"), zarr name, shape, dtype."""

    path: str
    name: str
    shape: tuple
    dtype: object  # numpy dtype (bfloat16 is ml_dtypes')

    @property
    def nbytes(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count * self.dtype.itemsize


def read_spec(directory: str, name: str, use_ocdbt: bool, use_zarr3: bool) -> dict:
    """The TensorStore spec that opens array `name` of the checkpoint in `directory` for reading (as Orbax does)."""
    directory = os.path.abspath(directory)
    if use_ocdbt:
        kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": directory}, "path": name,
                   "cache_pool": "cache_pool#ocdbt"}
    else:
        kvstore = {"driver": "file", "path": os.path.join(directory, name)}
    return {"driver": "zarr3" if use_zarr3 else "zarr", "kvstore": kvstore, "recheck_cached_data": False,
            "recheck_cached_metadata": False, "fill_missing_data_reads": False}


def _leaf_paths(metadata: dict, directory: str) -> list[tuple[str, ...]]:
    tree = metadata.get("tree_metadata")
    if not isinstance(tree, dict):
        raise ValueError(f"{directory}/_METADATA has no `tree_metadata`: not an Orbax PyTree checkpoint")
    paths = []
    for literal, entry in tree.items():
        keys = entry.get("key_metadata") if isinstance(entry, dict) else None
        path = tuple(str(k["key"]) for k in keys) if keys else tuple(str(k) for k in ast.literal_eval(literal))
        value = entry.get("value_metadata", {}) if isinstance(entry, dict) else {}
        if value.get("skip_deserialize") or value.get("value_type", "np.ndarray") not in ARRAY_TYPES:
            continue
        paths.append(path)
    return paths


class OrbaxCheckpoint:
    """The arrays of an Orbax PyTree checkpoint rooted at `params/` (spec G), opened lazily, read by selection.

    Args:
        directory: the checkpoint folder (holds `_METADATA`).
    Raises:
        FileNotFoundError: no such folder or no `_METADATA`. ValueError: not a PyTree checkpoint, or not rooted at
            `params/transformer/`. ImportError: TensorStore missing (with the pip command).
    """

    def __init__(self, directory):
        self.ts = require_tensorstore()
        self.directory = os.path.abspath(os.fspath(directory))
        meta_file = os.path.join(self.directory, "_METADATA")
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise NotADirectoryError(f"{self.directory} is a file: SRC must be the Orbax checkpoint folder (the one "
                                     "that holds _METADATA)")
        if not os.path.isdir(self.directory):
            raise FileNotFoundError(f"Orbax checkpoint folder {self.directory} does not exist")
        if not os.path.isfile(meta_file):
            raise FileNotFoundError(f"{self.directory} has no _METADATA file: not an Orbax PyTree checkpoint (pass "
                                    "the folder that holds _METADATA)")
        try:
            with open(meta_file, encoding="utf-8") as f:
                metadata = json.load(f)
        except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
            raise ValueError(f"{meta_file} is not valid JSON ({error}): the checkpoint's metadata is damaged") from None
        if not isinstance(metadata, dict):
            raise ValueError(f"{meta_file} must hold a JSON object, got {type(metadata).__name__}")
        self.use_ocdbt = bool(metadata.get("use_ocdbt", os.path.isfile(os.path.join(self.directory,
                                                                                     "manifest.ocdbt"))))
        self.use_zarr3 = bool(metadata.get("use_zarr3", False))
        try:
            leaves = _leaf_paths(metadata, self.directory)
        except (ValueError, SyntaxError, TypeError, KeyError, AttributeError) as error:
            if isinstance(error, ValueError) and "_METADATA" in str(error):
                raise
            raise ValueError(f"{meta_file}: `tree_metadata` is damaged ({type(error).__name__}: {error})") from None
        if not any(p[:2] == ("params", "transformer") for p in leaves):
            roots = sorted({"/".join(p[:2]) for p in leaves})[:5]
            raise ValueError(f"{self.directory} is not rooted at params/transformer/ (spec G); its top-level paths "
                             f"are {roots}")
        # decoded chunks are not cached (cache_pool 0) unless a reader asks; OCDBT's b-tree nodes are, on their own
        self.context = self.ts.Context({"cache_pool": {"total_bytes_limit": 0},
                                        "cache_pool#ocdbt": {"total_bytes_limit": METADATA_CACHE_BYTES}})
        self._names = {"/".join(p[1:]): ".".join(p) for p in leaves if p[0] == "params"}
        self._arrays: dict[str, OrbaxArray] = {}

    def paths(self) -> list[str]:
        """Every array path below `params/`, e.g. "transformer/embedder/input_embedding"."""
        return sorted(self._names)

    def where(self, path: str) -> str:
        """Where array `path` is stored, for error messages."""
        name = self._names[path]
        if self.use_ocdbt:
            return f"zarr array {name} in the OCDBT database of {self.directory}"
        return os.path.join(self.directory, name)

    def _open(self, path: str, cache_bytes: int = 0):
        spec = read_spec(self.directory, self._names[path], self.use_ocdbt, self.use_zarr3)
        context = self.context if not cache_bytes else self.ts.Context(
            {"cache_pool": {"total_bytes_limit": int(cache_bytes)}}, parent=self.context)
        with reading(path, self.where(path)):
            return self.ts.open(spec, open=True, read=True, context=context).result()

    def array(self, path: str) -> OrbaxArray:
        """Shape and dtype of the array at `path` (its zarr metadata only; no data is read)."""
        if path not in self._arrays:
            store = self._open(path)
            self._arrays[path] = OrbaxArray(path, self._names[path], tuple(store.shape), store.dtype.numpy_dtype)
        return self._arrays[path]

    def reader(self, path: str, reads: int = 1) -> "ArrayReader":
        """The array at `path`, open for `reads` selections. When several selections share a storage chunk (a
        stacked array saved as one chunk, read layer by layer), that chunk stays cached so it is decoded once."""
        info = self.array(path)
        reader = ArrayReader(info, self._open(path), self.where(path))
        shape = reader.store.chunk_layout.read_chunk.shape
        if reads > 1 and shape is not None and len(shape) and (shape[0] or 0) > 1:
            chunk_bytes = info.dtype.itemsize
            for n in shape:
                chunk_bytes *= n
            reader = ArrayReader(info, self._open(path, cache_bytes=chunk_bytes + 2**20), self.where(path))
        return reader


class CheckpointReadError(ValueError):
    """An array of the checkpoint could not be read (a truncated, deleted or corrupt file); names the array and
    where it is stored."""


@contextlib.contextmanager
def reading(path: str, where: str):
    """Turn TensorStore's (or the chunk decoder's) error while reading array `path` into a `CheckpointReadError`."""
    try:
        yield
    except CheckpointReadError:
        raise
    except Exception as error:  # noqa: BLE001 - TensorStore raises ValueError/RuntimeError with a status text
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointReadError(f"cannot read array params/{path} ({where}): {detail}; the checkpoint is "
                                  "truncated or damaged") from None


class ArrayReader:
    """One open Orbax array; `read(select, rows)` returns `array[select][rows]` as a NumPy array (stored dtype).
    Read errors name the array (`CheckpointReadError`)."""

    def __init__(self, info: OrbaxArray, store, where: str = "?"):
        self.info, self.store, self.where = info, store, where

    def rows_per_chunk(self, select: tuple = ()) -> int:
        """How many leading rows of `array[select]` one storage chunk holds (0 for a 0-d selection).

        A single-host Orbax save stores each array as one chunk; a multi-device save stores one chunk per shard, and
        `SaveArgs(chunk_byte_size=...)` smaller ones: reads aligned with them decode each chunk once.
        """
        view = self.store[select] if select else self.store
        shape = view.chunk_layout.read_chunk.shape
        return int(shape[0]) if shape is not None and len(shape) and shape[0] else 0

    def stream_rows(self, rows_per_slab: int):
        """The whole array as consecutive row slabs, decoded as they are read (`chunk_stream`), or None when its
        storage cannot be streamed that way."""
        from .chunk_stream import streamed_rows

        with reading(self.info.path, self.where):
            slabs = streamed_rows(self.store, rows_per_slab)
        return None if slabs is None else self._guarded(slabs)

    def _guarded(self, slabs):
        with reading(self.info.path, self.where):
            yield from slabs

    def read(self, select: tuple = (), rows: tuple[int, int] | None = None):
        with reading(self.info.path, self.where):
            view = self.store[select] if select else self.store
            if rows is not None:
                view = view[rows[0]:rows[1]]
            return view.read().result()
