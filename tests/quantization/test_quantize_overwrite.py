"""`quantize` (quantization/quantize.py, cli.py) through `atomic_folder`: a destination holding a checkpoint is refused
without --overwrite (before any work), nothing of the old checkpoint survives an overwrite, an interrupted run keeps
the old checkpoint whole, and --max-shard-size must be > 0."""

import json

import pytest
import torch

from conftest import tiny_model
from diffusiongemma import DiffusionGemmaForBlockDiffusion as Model
from diffusiongemma.cli import main
from diffusiongemma.quantization import quantize as quantize_module
from diffusiongemma.quantization.quantize import quantize_checkpoint


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense")
    tiny_model(seed=3).save_pretrained(path)
    return path


def stale_sharded(dst):
    tiny_model(seed=4).save_pretrained(dst, max_shard_size="100KB")
    assert (dst / "model.safetensors.index.json").exists()


def test_refused_without_overwrite(src, tmp_path, capsys):
    dst = tmp_path / "out"
    stale_sharded(dst)
    before = sorted(p.name for p in dst.iterdir())
    with pytest.raises(FileExistsError, match="already holds a checkpoint: pass overwrite=True"):
        quantize_checkpoint(str(src), str(dst), "fp8-dynamic")
    assert main(["quantize", "--scheme", "fp8-dynamic", str(src), str(dst)]) != 0
    assert "already holds a checkpoint" in capsys.readouterr().err
    assert sorted(p.name for p in dst.iterdir()) == before


def test_overwrite_leaves_no_stale_index_or_shards(src, tmp_path):
    dst = tmp_path / "out"
    stale_sharded(dst)
    assert main(["quantize", "--scheme", "fp8-dynamic", "--overwrite", str(src), str(dst)]) == 0
    names = sorted(p.name for p in dst.iterdir())
    assert "model.safetensors.index.json" not in names and not [n for n in names if n.startswith("model-")]
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["format"] == "float-quantized"
    Model.from_pretrained(dst)  # loads the new checkpoint, not the stale one


def test_interrupted_quantize_keeps_the_old(src, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    stale_sharded(dst)
    old = Model.from_pretrained(dst).state_dict()

    def interrupted(tensors, folder, max_shard_bytes):
        next(iter(tensors))
        raise KeyboardInterrupt
    monkeypatch.setattr(quantize_module, "save_sharded", interrupted)
    with pytest.raises(KeyboardInterrupt):
        quantize_checkpoint(str(src), str(dst), "fp8-dynamic", overwrite=True)
    again = Model.from_pretrained(dst).state_dict()
    assert all(torch.equal(old[k], again[k]) for k in old)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


@pytest.mark.parametrize("size", ["0", "-1", "nan", "inf", "1e-12", "big"])
def test_bad_max_shard_size(src, tmp_path, size, capsys):
    with pytest.raises(SystemExit):
        main(["quantize", "--scheme", "fp8-dynamic", "--max-shard-size", size, str(src), str(tmp_path / "o")])
    assert "--max-shard-size" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", [0, -5, 1.5, True])
def test_bad_max_shard_bytes_api(src, tmp_path, value):
    with pytest.raises(ValueError, match="`max_shard_bytes` must be a positive int"):
        quantize_checkpoint(str(src), str(tmp_path / "o"), "fp8-dynamic", max_shard_bytes=value)


def test_same_folder_refused(src):
    with pytest.raises(ValueError, match="must differ from the source folder"):
        quantize_checkpoint(str(src), str(src), "fp8-dynamic", overwrite=True)
