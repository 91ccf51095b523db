"""conversion/safetensors_stream.py: shards planned up front, written in pieces, read back by safetensors itself."""

import json

import pytest
import torch
from safetensors.torch import load_file

from diffusiongemma.conversion.safetensors_stream import ShardedWriter, TensorEntry, parse_size, plan_shards


def test_parse_size_uses_transformers_units():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("300KB") == 300_000
    assert parse_size(1234) == 1234
    for bad in ("lots", "0GB", "-1MB", "5 parsecs"):
        with pytest.raises(ValueError, match="--max-shard-size"):
            parse_size(bad)


def test_plan_shards_is_greedy_and_gives_big_tensors_their_own_shard():
    entries = [TensorEntry("a", (10,), "float32"), TensorEntry("b", (10,), "float32"),  # 40 bytes each
               TensorEntry("big", (100,), "float32"), TensorEntry("c", (5,), "bfloat16")]
    assert [[e.key for e in s] for s in plan_shards(entries, 100)] == [["a", "b"], ["big"], ["c"]]


def test_pieces_written_in_order_read_back_with_safetensors(tmp_path):
    tensors = {"x": torch.arange(12, dtype=torch.float32).reshape(3, 4), "y": torch.randn(5).to(torch.bfloat16),
               "z": torch.ones(2, 2, dtype=torch.float16)}
    entries = [TensorEntry(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in tensors.items()]
    shards = plan_shards(entries, 50)
    writer = ShardedWriter(str(tmp_path), shards)
    for key, value in tensors.items():
        writer.begin(key)
        raw = value.reshape(-1).view(torch.uint8).numpy()
        writer.write(raw[:4])
        writer.write(raw[4:])
    weight_map = writer.finish(total_parameters=29)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index == {"metadata": {"total_parameters": 29, "total_size": 48 + 10 + 8}, "weight_map": weight_map}
    for name in set(weight_map.values()):
        for key, value in load_file(str(tmp_path / name)).items():
            assert torch.equal(value, tensors[key]) and value.dtype == tensors[key].dtype


def test_out_of_order_or_short_writes_are_refused(tmp_path):
    writer = ShardedWriter(str(tmp_path), plan_shards([TensorEntry("a", (2,), "float32"),
                                                       TensorEntry("b", (2,), "float32")], 10**6))
    with pytest.raises(RuntimeError, match="expected tensor a next, got b"):
        writer.begin("b")
    writer.close()
    writer = ShardedWriter(str(tmp_path), plan_shards([TensorEntry("a", (2,), "float32")], 10**6))
    writer.begin("a")
    with pytest.raises(RuntimeError, match="past the end"):
        writer.write(bytes(12))
    writer.write(bytes(4))
    with pytest.raises(RuntimeError, match="before every planned tensor"):
        writer.finish(2)
    writer.close()
