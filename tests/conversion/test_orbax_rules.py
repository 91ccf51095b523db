"""The rule table (conversion/rules.py) and the reader (conversion/orbax.py): the table produces exactly the keys and
shapes both model classes hold, each transform is the spec's, and the reader opens arrays as Orbax does."""

import numpy as np
import pytest
import torch
from conftest import VISION, tiny_config
from orbax_fixtures import source_model, write_checkpoint  # skips the module without the convert extra
from transformers import DiffusionGemmaConfig

from diffusiongemma import DiffusionGemmaForBlockDiffusion
from diffusiongemma.conversion import convert_orbax, expand_rules, load_config, verify_conversion
from diffusiongemma.conversion import transform
from diffusiongemma.conversion.orbax import ArrayReader, OrbaxCheckpoint, read_spec
from diffusiongemma.conversion.rules import source_part_from_target
from diffusiongemma.conversion.synthetic import write_orbax_checkpoint
from diffusiongemma.conversion.transform import converted_chunks


def meta_shapes(config) -> dict:
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}


@pytest.mark.parametrize("which", ["tiny", "released 26B-A4B"])
def test_rules_give_every_key_and_shape_of_the_model(which):
    config = tiny_config() if which == "tiny" else load_config(None)
    planned = expand_rules(config)
    assert {t.key: t.shape for t in planned} == meta_shapes(config)
    text = {t.key for t in expand_rules(config, text_only=True)}
    assert text == {k for k in meta_shapes(config) if "vision_tower" not in k and "embed_vision" not in k}


def test_released_config_source_shapes_follow_spec_g():
    by_key = {t.key: t for t in expand_rules(load_config(None))}
    q5 = by_key["model.decoder.layers.5.self_attn.q_proj.weight"]  # a full layer: Dh 512
    assert (q5.orbax_path, q5.source_shape) == ("params/transformer/layer_5/attn/q_einsum/w", (16, 2816, 512))
    k0 = by_key["model.decoder.layers.0.self_attn.k_proj.weight"]  # sliding: K 8 from the per-layer config
    assert (k0.node, k0.source_shape, k0.select) == ("transformer/layer_0/attn/kv_einsum", (2, 8, 2816, 256), (0,))
    gate_up = by_key["model.decoder.layers.0.experts.gate_up_proj"]
    assert (gate_up.source_shape, gate_up.shape) == ((128, 2, 704, 2816), (128, 1408, 2816))
    v26 = by_key["model.encoder.vision_tower.encoder.layers.26.self_attn.v_proj.linear.weight"]
    assert (v26.source_shape, v26.select) == ((27, 2, 16, 1152, 72), (26, 1))
    pos = by_key["model.encoder.vision_tower.patch_embedder.position_embedding_table"]
    assert (pos.source_shape, pos.shape) == ((10240, 2, 1152), (2, 10240, 1152))
    assert by_key["model.encoder.embed_vision.embedding_projection.weight"].source_shape == (1152, 2816)


def forward(item, part):
    out = b"".join(c.tobytes() for c in converted_chunks(part, item, "float32", chunk_bytes=64))
    return np.frombuffer(out, np.float32).reshape(item.shape)


def test_transforms_match_spec_g_by_hand():
    by_key = {t.key: t for t in expand_rules(tiny_config())}
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 64, 16), dtype=np.float32)  # q_einsum [N, H, Dh]
    item = by_key["model.decoder.layers.0.self_attn.q_proj.weight"]
    out = forward(item, q)
    # spec G: transpose(1,0,2) -> reshape [H, N*Dh] -> T, so row n*Dh + d, column h is q[n, h, d]
    assert out[2 * 16 + 5, 7] == q[2, 7, 5]
    assert np.array_equal(out, q.transpose(1, 0, 2).reshape(64, 64).T)
    o = rng.standard_normal((4, 16, 64), dtype=np.float32)  # attn_vec_einsum [N, Dh, H]
    item = by_key["model.decoder.layers.0.self_attn.o_proj.weight"]
    assert np.array_equal(forward(item, o), o.transpose(2, 0, 1).reshape(64, 64))
    down = rng.standard_normal((4, 32, 64), dtype=np.float32)  # mlp/linear [E, Im, H]
    item = by_key["model.decoder.layers.0.experts.down_proj"]
    assert np.array_equal(forward(item, down), down.transpose(0, 2, 1))
    for key, value in by_key.items():  # the inverse the tests build checkpoints with undoes every rule
        part = rng.standard_normal(value.transposed_shape(), dtype=np.float32).reshape(value.shape)
        assert np.array_equal(forward(value, source_part_from_target(value, part)), part), key


def test_our_read_spec_is_orbaxs(tmp_path):
    import orbax.checkpoint as ocp
    from etils import epath

    tree = {"params": {"transformer": {"a": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}}}}
    for use_ocdbt in (True, False):
        path = tmp_path / f"ocdbt_{use_ocdbt}"
        handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt)
        ocp.Checkpointer(handler).save(str(path), args=ocp.args.PyTreeSave(tree))
        info = ocp.type_handlers.ParamInfo(name="params.transformer.a.w", parent_dir=epath.Path(path),
                                           is_ocdbt_checkpoint=use_ocdbt, use_zarr3=False)
        theirs = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=use_ocdbt)
        ours = read_spec(str(path), "params.transformer.a.w", use_ocdbt, use_zarr3=False)
        assert ours["driver"] == theirs["driver"]
        assert {k: v for k, v in ours["kvstore"].items()} == {k: v for k, v in theirs["kvstore"].items()}
        checkpoint = OrbaxCheckpoint(path)
        assert checkpoint.use_ocdbt == use_ocdbt
        assert np.array_equal(checkpoint.reader("transformer/a/w").read((1,)), [3, 4, 5])


def test_checkpoint_not_rooted_at_params_transformer(tmp_path):
    write_orbax_checkpoint({"weights": {"a": np.ones(2, np.float32)}}, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="not rooted at params/transformer/"):
        OrbaxCheckpoint(tmp_path / "ckpt")


def test_stacked_vision_layers_and_standardize_convert_exactly(tmp_path):
    vision = dict(VISION, num_hidden_layers=3, standardize=True)
    config = DiffusionGemmaConfig(text_config=tiny_config().text_config.to_dict(), vision_config=vision,
                                  canvas_length=16)
    model = source_model(config)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith(("std_bias", "std_scale")):
                buffer.copy_(torch.randn(buffer.shape))
    src = write_checkpoint(tmp_path / "ckpt", model, config)
    convert_orbax(src, tmp_path / "hf", config=config, dtype="float32", progress=False)
    loaded = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "hf")
    want, got = model.state_dict(), loaded.state_dict()
    assert "model.encoder.vision_tower.encoder.layers.2.mlp.up_proj.linear.weight" in got
    assert "model.encoder.vision_tower.std_scale" in got
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    assert verify_conversion(src, tmp_path / "hf") == []


def test_chunked_storage_is_read_in_slabs_and_converts_exactly(tmp_path, monkeypatch):
    config = tiny_config()
    model = source_model(config)
    src = write_checkpoint(tmp_path / "ckpt", model, config, chunk_bytes=4096)  # 16 embedding rows per chunk
    reads = []
    real = ArrayReader.read

    def spy(self, select=(), rows=None):
        reads.append((self.info.path, select, rows))
        return real(self, select, rows)

    monkeypatch.setattr(ArrayReader, "read", spy)
    # TensorStore's own reads, as for stores chunk_stream does not decode (zarr3) or without zstandard
    monkeypatch.setattr(ArrayReader, "stream_rows", lambda self, rows_per_slab: None)
    monkeypatch.setattr(transform.streamed_chunks, "__defaults__", (8192,))  # slabs of two chunks
    convert_orbax(src, tmp_path / "hf", config=config, dtype="float32", progress=False)
    embedding = [rows for path, _, rows in reads if path == "transformer/embedder/input_embedding"]
    assert embedding == [(0, 32), (32, 64), (64, 96), (96, 128)]  # [128, 64] float32: 256 bytes a row
    got = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "hf").state_dict()
    want = model.state_dict()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    assert verify_conversion(src, tmp_path / "hf") == []
