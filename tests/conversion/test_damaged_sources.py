"""`convert orbax` and `convert verify` on damaged inputs (issue 29): truncated, deleted or corrupt source files, a
damaged `_METADATA`, a SRC that is a file, a `--config` that is a JSON list, a DST that is a symlink to SRC, and a
truncated or garbled safetensors file all give one clear error naming the array or the file."""

import os

import pytest
from conftest import tiny_config
from orbax_fixtures import source_model, write_checkpoint

from diffusiongemma.cli import main
from diffusiongemma.conversion import convert_orbax, verify_conversion
from diffusiongemma.conversion.orbax import CheckpointReadError


@pytest.fixture(scope="module")
def model_and_config():
    config = tiny_config()
    return source_model(config), config


@pytest.fixture
def src(tmp_path, model_and_config):
    model, config = model_and_config
    return write_checkpoint(tmp_path / "ckpt", model, config)


def data_files(src):
    """The checkpoint's stored data files (OCDBT data or per-array chunk files), largest first."""
    files = [os.path.join(root, name) for root, _, names in os.walk(src) for name in names
             if name not in ("_METADATA", "_CHECKPOINT_METADATA", "_sharding", "manifest.ocdbt")
             and not name.startswith(".")]
    return sorted(files, key=os.path.getsize, reverse=True)


def convert(src, dst, config, capsys):
    config.save_pretrained(os.path.join(os.path.dirname(dst), "cfg"))
    code = main(["convert", "orbax", str(src), str(dst), "--config", os.path.join(os.path.dirname(dst), "cfg"),
                 "--quiet"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncate", "delete", "garble"])
def test_a_damaged_data_file_names_the_array(src, tmp_path, model_and_config, capsys, damage):
    victim = data_files(src)[0]
    if damage == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
    elif damage == "delete":
        os.remove(victim)
    else:
        with open(victim, "r+b") as f:
            f.write(b"\xff" * min(4096, os.path.getsize(victim)))
    with pytest.raises((CheckpointReadError, ValueError, FileNotFoundError)) as error:
        convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)
    message = str(error.value)
    assert "params/" in message or str(src) in message, message
    code, err = convert(src, tmp_path / "hf2", model_and_config[1], capsys)
    assert code != 0 and "Traceback" not in err and err.startswith("error:"), err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("metadata, message", [
    ("{not json", "is not valid JSON"), ("[1, 2]", "must hold a JSON object"),
    ('{"tree_metadata": {"(((": {}}}', "`tree_metadata` is damaged"),
])
def test_a_damaged_metadata_file_is_named(src, tmp_path, model_and_config, metadata, message):
    (src / "_METADATA").write_text(metadata)
    with pytest.raises(ValueError, match=message) as error:
        convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)
    assert "_METADATA" in str(error.value)


def test_a_source_that_is_a_file_and_a_config_that_is_a_list(tmp_path, model_and_config, src):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        convert_orbax(tmp_path / "file", tmp_path / "hf", config=model_and_config[1], progress=False)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        convert_orbax(src, tmp_path / "hf", config=tmp_path / "list.json", progress=False)


def test_a_destination_linked_to_the_source_is_refused(tmp_path, model_and_config, src):
    os.symlink(src, tmp_path / "link")
    with pytest.raises(ValueError, match="must differ"):
        convert_orbax(src, tmp_path / "link", config=model_and_config[1], progress=False, overwrite=True)
    assert (src / "_METADATA").is_file()  # untouched
    os.symlink(tmp_path / "elsewhere", tmp_path / "dangling")
    with pytest.raises(ValueError, match="symbolic link"):
        convert_orbax(src, tmp_path / "dangling", config=model_and_config[1], progress=False)


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[: len(b) // 2], "is truncated"), (lambda b: b[:4], "shorter than a safetensors header"),
    (lambda b: (10**12).to_bytes(8, "little") + b[8:], "header claims"),
    (lambda b: b[:8] + b"\xff" * 16 + b[24:], "header is not valid JSON"),
])
def test_verify_names_a_damaged_safetensors_file(tmp_path, model_and_config, src, capsys, damage, message):
    convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)
    shard = next((tmp_path / "hf").glob("*.safetensors"))
    shard.write_bytes(damage(shard.read_bytes()))
    problems = verify_conversion(src, tmp_path / "hf")
    assert any(message in p and shard.name in p for p in problems), problems
    assert main(["convert", "verify", str(src), str(tmp_path / "hf"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "SafetensorError" not in err


def test_a_flipped_bit_that_still_decodes_is_not_detectable(src, tmp_path, model_and_config):
    """What docs/conversion.md says: the format carries no checksums, so a flip inside a chunk's payload converts
    (and verifies) without error. If this starts failing, the format gained integrity data: update the docs."""
    victim = data_files(src)[0]
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) // 2)
        byte = f.read(1)
        f.seek(os.path.getsize(victim) // 2)
        f.write(bytes([byte[0] ^ 1]))
    convert_orbax(src, tmp_path / "hf", config=model_and_config[1], progress=False)
    assert verify_conversion(src, tmp_path / "hf") == []
