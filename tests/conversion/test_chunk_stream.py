"""`chunk_stream.streamed_rows`: zarr chunks decoded as a stream give exactly what TensorStore reads, for one chunk,
chunks split along any axes (with cropped edge chunks), tiny byte-range reads, no compressor, and the OCDBT store of
a checkpoint orbax-checkpoint wrote; layouts it cannot stream are left to TensorStore (None)."""

import sys

import numpy as np
import pytest
from conftest import tiny_config
from orbax_fixtures import source_model, write_checkpoint

from diffusiongemma.conversion import chunk_stream
from diffusiongemma.conversion.orbax import OrbaxCheckpoint

ts = pytest.importorskip("tensorstore")
pytest.importorskip("zstandard")


def zarr_array(path, values: np.ndarray, chunks, compressor="zstd", driver="zarr"):
    metadata = {"shape": list(values.shape), "chunks": list(chunks), "dtype": "<f4"}
    if driver == "zarr":
        metadata["compressor"] = {"id": compressor, "level": 1} if compressor else None
    else:
        metadata = {"shape": list(values.shape), "data_type": "float32",
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}}}
    store = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(path)}, "metadata": metadata},
                    create=True).result()
    store.write(values).result()
    return ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(path)}}).result()


def streamed(store, rows: int) -> np.ndarray:
    slabs = chunk_stream.streamed_rows(store, rows)
    assert slabs is not None
    slabs = list(slabs)
    assert all(0 < len(s) <= rows for s in slabs)  # bounded slabs (they do not cross a band of chunks)
    return np.concatenate(slabs)


@pytest.mark.parametrize("shape, chunks", [((6, 5, 4), (6, 5, 4)),      # one chunk
                                           ((5, 7, 9), (5, 3, 4)),      # split along later axes, cropped edges
                                           ((4, 2, 8), (8, 1, 8)),      # a chunk longer than the first axis
                                           ((7, 6), (3, 4)),            # bands of chunks along the first axis too
                                           ((9, 4), (2, 4))])
@pytest.mark.parametrize("compressor", ["zstd", None])
def test_rows_equal_tensorstores_read(tmp_path, monkeypatch, shape, chunks, compressor):
    monkeypatch.setattr(chunk_stream, "READ_BYTES", 64)  # many byte-range reads, a short last one
    monkeypatch.setattr(chunk_stream, "MIN_READ_BYTES", 16)
    values = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    store = zarr_array(tmp_path / "a", values, chunks, compressor)
    for rows in (1, 2, shape[0]):
        assert np.array_equal(streamed(store, rows), values)


def test_layouts_it_cannot_stream_are_left_to_tensorstore(tmp_path):
    values = np.zeros((6, 4), np.float32)
    assert chunk_stream.streamed_rows(zarr_array(tmp_path / "v3", values, (6, 4), driver="zarr3"), 2) is None
    assert chunk_stream.streamed_rows(zarr_array(tmp_path / "1d", np.zeros(6, np.float32), (6,)), 2) is None


def test_truncated_chunk_is_an_error(tmp_path):
    values = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    zarr_array(tmp_path / "a", values, (8, 16), compressor=None)
    (tmp_path / "a" / "0.0").write_bytes((tmp_path / "a" / "0.0").read_bytes()[:100])
    store = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "a")}}).result()
    with pytest.raises(ValueError, match="ended before"):
        list(chunk_stream.streamed_rows(store, 8))


@pytest.mark.parametrize("chunk_bytes", [None, 2048])
def test_orbax_checkpoint_arrays_stream_through_ocdbt(tmp_path, chunk_bytes):
    config = tiny_config()
    path = write_checkpoint(tmp_path / "ckpt", source_model(config), config, dtype="bfloat16",
                            chunk_bytes=chunk_bytes)
    checkpoint = OrbaxCheckpoint(path)
    streamed_arrays = 0
    for name in checkpoint.paths():
        reader = checkpoint.reader(name)
        slabs = reader.stream_rows(3)
        if slabs is None:
            continue
        streamed_arrays += 1
        assert np.array_equal(np.concatenate(list(slabs)), reader.read()), name
    assert streamed_arrays >= 10  # embedding, attention, experts, ...: every 2-D+ array stored in one chunk


def test_without_zstandard_zstd_chunks_are_left_to_tensorstore(tmp_path, monkeypatch):
    values = np.ones((4, 4), np.float32)
    zstd_store = zarr_array(tmp_path / "zstd", values, (4, 4))
    raw_store = zarr_array(tmp_path / "raw", values, (4, 4), compressor=None)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now raises ImportError
    assert chunk_stream.streamed_rows(zstd_store, 2) is None
    assert np.array_equal(streamed(raw_store, 2), values)  # uncompressed chunks need no decoder
