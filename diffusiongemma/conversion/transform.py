"""Apply one planned rule to the array it reads, in bounded slices: `converted_chunks` yields the output tensor's bytes
in order, each slice transposed, cast via float32 (spec G) and then to the target dtype.

The converter writes these bytes; `verify` compares them with what was written. Both therefore agree on "exact after
the dtype cast" by construction, and the tests check the result against the source model independently.
"""

import numpy as np
import torch

from .rules import PlannedTensor

__all__ = ["CHUNK_BYTES", "SLAB_BYTES", "TORCH_DTYPES", "converted_chunks", "streamed_chunks"]

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CHUNK_BYTES = 16 * 2**20  # float32 bytes per slice: the fixed working memory on top of the array read
SLAB_BYTES = 16 * 2**20  # source bytes per read when the storage chunks allow reading part of an array


def converted_chunks(part: np.ndarray, item: PlannedTensor, dtype: str, chunk_bytes: int = CHUNK_BYTES,
                     rows: int | None = None):
    """Yield the bytes (uint8 arrays) of `item`'s Hugging Face tensor, from `part` = source[item.select].

    The transposed selection has the output's byte order (a reshape changes no bytes), so slicing it along its first
    axis gives consecutive byte ranges of the output. `rows`: `part` is a slab of that many leading rows of a rule
    whose transpose keeps the first axis in place (`streamed_chunks`).

    Raises:
        ValueError: `part` does not have the shape the rule expects (names the Orbax path and both shapes).
    """
    view = part.transpose(item.perm) if item.perm else part
    expected = item.transposed_shape()
    if rows is not None:
        expected = (rows, *expected[1:])
    if tuple(view.shape) != expected:
        raise ValueError(f"{item.orbax_path}{list(item.select) if item.select else ''}: expected shape "
                         f"{expected} after transposing, found {tuple(view.shape)}")
    if view.ndim == 0:
        view = view.reshape(1)
    row_bytes = 4 * int(np.prod(view.shape[1:], dtype=np.int64))
    step = max(1, chunk_bytes // max(row_bytes, 1))
    target = TORCH_DTYPES[dtype]
    for start in range(0, view.shape[0], step):
        chunk = np.ascontiguousarray(view[start:start + step], dtype=np.float32)  # spec G: via float32
        out = torch.from_numpy(chunk).to(target)
        yield out.reshape(-1).view(torch.uint8).numpy()


def streamed_chunks(reader, item: PlannedTensor, dtype: str, slab_bytes: int = SLAB_BYTES):
    """`converted_chunks` of `item`, reading its source through `reader` (an `orbax.ArrayReader`). When the rule keeps
    the first axis first, a whole array is decoded as a stream of row slabs (`chunk_stream`) where its storage allows,
    else one chunked along that axis is read in slabs of whole chunks; otherwise the selection is read at once."""
    part_shape = item.source_shape[len(item.select):]
    keeps_first_axis = len(part_shape) > 1 and (item.perm is None or item.perm[0] == 0)
    per_chunk = reader.rows_per_chunk(item.select) if keeps_first_axis else 0
    row_bytes = reader.info.dtype.itemsize * int(np.prod(part_shape[1:], dtype=np.int64))
    if keeps_first_axis and not item.select:  # decode the chunks as streams of rows
        slabs = reader.stream_rows(max(1, slab_bytes // max(row_bytes, 1)))
        if slabs is not None:
            for slab in slabs:
                yield from converted_chunks(slab, item, dtype, rows=slab.shape[0])
            return
    if not per_chunk or per_chunk >= part_shape[0]:
        yield from converted_chunks(reader.read(item.select), item, dtype)
        return
    step = max(1, slab_bytes // (row_bytes * per_chunk)) * per_chunk
    for start in range(0, part_shape[0], step):
        stop = min(start + step, part_shape[0])
        yield from converted_chunks(reader.read(item.select, (start, stop)), item, dtype, rows=stop - start)
