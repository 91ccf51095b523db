"""Stream the rows of a zarr v2 array, chunk by chunk, without decoding any chunk whole.

TensorStore decodes a chunk whole: while it does, the compressed bytes and the decoded chunk are both in memory. An
Orbax array saved by a single host is one chunk (spec G), and a multi-device save may split an array along a later
axis only (the experts' [E, 2, M, H] along the 2): either way a chunk is as large as the array, and reading it would
cost about twice the array. Here each chunk's compressed bytes are read in byte ranges through the array's own
TensorStore key-value store (file or OCDBT alike) and fed to a zstd stream decoder; the array's rows come out a slab
at a time, each slab assembled from the same rows of every chunk of its band (the chunks that share a first-axis
index; bands follow each other). The working memory is a few slabs plus one read buffer per chunk of a band,
whatever the array's and the chunks' sizes.

Only that layout is streamed (zarr v2, C order, no filters, zstd or no compressor, little-endian, at most MAX_CHUNKS
chunks in a band); anything else returns None and is read through TensorStore as before.

Legend: r rows (the array's first axis), C the rest of its shape.
"""

import itertools
import json
import math

import numpy as np

__all__ = ["MAX_CHUNKS", "READ_BYTES", "streamed_rows"]

READ_BYTES = 8 * 2**20  # compressed bytes per key-value read, shared out among the chunks read side by side
MIN_READ_BYTES = 2**20
MAX_CHUNKS = 64  # chunks of one band decoded side by side at most (each holds a read buffer and a decoder)


def _layout(store) -> dict | None:
    """The zarr v2 metadata of `store` when its layout can be streamed (see the module docstring), else None."""
    try:
        meta = json.loads(store.kvstore[b".zarray"])
    except Exception:  # zarr3, a store without that key, unreadable metadata: not ours to stream
        return None
    shape, chunks = list(meta.get("shape", [])), list(meta.get("chunks", []))
    compressor = (meta.get("compressor") or {}).get("id")
    if (meta.get("zarr_format") != 2 or meta.get("order") != "C" or meta.get("filters") or len(shape) < 2
            or len(chunks) != len(shape) or compressor not in (None, "zstd")
            or str(meta.get("dtype", ""))[:1] == ">"):
        return None
    grid = [math.ceil(n / c) for n, c in zip(shape, chunks)]
    if math.prod(grid[1:]) > MAX_CHUNKS:
        return None
    return {**meta, "grid": grid}


def _compressed_pieces(kvstore, key: bytes, read_bytes: int):
    """The stored bytes of `key`, `read_bytes` at a time (byte-range reads)."""
    start = 0
    while True:
        try:
            piece = kvstore.read(key, byte_range=slice(start, start + read_bytes)).result().value
        except ValueError as error:  # OUT_OF_RANGE: fewer than read_bytes are left, so read them to the end
            if "OUT_OF_RANGE" not in str(error):
                raise
            piece = kvstore.read(key, byte_range=slice(start, None)).result().value
        if piece:
            yield piece
        if len(piece) < read_bytes:
            return
        start += read_bytes


def _decoded_pieces(kvstore, key: bytes, compressor, read_bytes: int):
    """One chunk's decoded bytes, in pieces as they come out of the decoder."""
    if compressor is None:
        yield from _compressed_pieces(kvstore, key, read_bytes)
        return
    import zstandard

    decoder = zstandard.ZstdDecompressor().decompressobj()
    for piece in _compressed_pieces(kvstore, key, read_bytes):
        out = decoder.decompress(piece)
        if out:
            yield out


class _ChunkRows:
    """Rows of one stored chunk (shape `chunks`, C order), taken from its decoded stream in order."""

    def __init__(self, kvstore, key: bytes, compressor, chunks: list[int], dtype, read_bytes: int):
        self.key, self.chunks, self.dtype = key, chunks, dtype
        self.row_bytes = dtype.itemsize * math.prod(chunks[1:])
        self.pieces = _decoded_pieces(kvstore, key, compressor, read_bytes)
        self.buffer = bytearray()

    def take(self, rows: int) -> np.ndarray:
        """The next `rows` rows: [rows, *chunks[1:]]."""
        need = rows * self.row_bytes
        while len(self.buffer) < need:
            piece = next(self.pieces, None)
            if piece is None:
                raise ValueError(f"stored chunk {self.key.decode()} ended before its {self.chunks[0]} rows")
            self.buffer += piece
        out = np.frombuffer(self.buffer[:need], dtype=self.dtype).reshape(rows, *self.chunks[1:])  # a writable copy
        del self.buffer[:need]
        return out


def streamed_rows(store, rows_per_slab: int):
    """Iterator of consecutive row slabs [r, *C] of the whole array `store` (its stored dtype), or None when its
    layout cannot be streamed (see the module docstring) or zstandard is not installed.

    (A stacked array read layer by layer is not streamed: each layer would decode the chunks from their start again.
    It goes through TensorStore's chunk cache instead.)

    Args:
        store: an open TensorStore zarr array. rows_per_slab: rows per yielded slab (the last may have fewer).
    """
    meta = _layout(store)
    if meta is None:
        return None
    compressor = (meta.get("compressor") or {}).get("id")
    if compressor == "zstd":
        try:
            import zstandard  # noqa: F401
        except ImportError:
            return None
    return _slabs(store.kvstore, meta, compressor, store.dtype.numpy_dtype, max(1, rows_per_slab))


def _slabs(kvstore, meta: dict, compressor, dtype, rows_per_slab: int):
    """Row slabs of the whole array, one band of chunks (the chunks sharing a first-axis index) after another."""
    shape, chunks, grid = meta["shape"], meta["chunks"], meta["grid"]
    separator = meta.get("dimension_separator", ".")
    band_size = math.prod(grid[1:])
    read_bytes = max(MIN_READ_BYTES, READ_BYTES // band_size)
    for band in range(grid[0]):
        readers = []  # (where the chunk's valid part goes in a slab row, its reader)
        for index in itertools.product(*(range(n) for n in grid[1:])):
            key = separator.join(str(i) for i in (band, *index)).encode()
            where = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, chunks[1:], shape[1:]))
            readers.append((where, _ChunkRows(kvstore, key, compressor, chunks, dtype, read_bytes)))
        band_rows = min(chunks[0], shape[0] - band * chunks[0])
        for start in range(0, band_rows, rows_per_slab):
            rows = min(rows_per_slab, band_rows - start)
            if band_size == 1 and list(chunks[1:]) == list(shape[1:]):
                yield readers[0][1].take(rows)  # [r, *C]
                continue
            slab = np.empty((rows, *shape[1:]), dtype=dtype)  # [r, *C]
            for where, reader in readers:
                part = reader.take(rows)
                slab[(slice(None), *where)] = part[(slice(None), *(slice(0, w.stop - w.start) for w in where))]
            yield slab
