"""Tensor and expert parallelism under `torchrun --nproc-per-node 2` on CPU (gloo), against one process.

One torchrun launch runs every mode of `parallel_worker.py` (loading, forward with and without self-conditioning,
fast and reference generation); the test process computes the same answers unsharded. Checked per mode: both ranks
return identical tensors, generated tokens equal the single process's, and logits equal its logits within
`LOGITS_TOLERANCE` (the all-reduces of row-parallel layers, the vocabulary-parallel soft embedding and the expert
all-reduce sum in another order than one process does).
"""

import os
import socket
import subprocess
import sys

import pytest
import torch

from conftest import tiny_config, tiny_model
from parallel_worker import compute

pytest.importorskip("torch.distributed")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch was built without the gloo backend", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parallel_worker.py")
MODES = ["tp", "ep", "tp_ep", "ep_a2a"]
# fp32, tiny model: measured max |difference| 1.5e-6 (logits) and 9.2e-6 (with self-conditioning) for logits of
# magnitude ~0.6; the bound leaves 10x room for other BLAS builds.
LOGITS_TOLERANCE = dict(atol=1e-4, rtol=1e-4)
LAUNCH_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """({mode: [rank 0 answers, rank 1 answers]}, single-process answers) for one 2-rank launch."""
    root = tmp_path_factory.mktemp("parallel")
    model_dir, out_dir = root / "model", root / "out"
    out_dir.mkdir()
    # heads 4, KV heads 2 on every layer (the full layer too), experts 4: all divide by 2
    tiny_model(tiny_config(num_global_key_value_heads=2)).save_pretrained(model_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), WORKER, str(model_dir), str(out_dir), *MODES]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"torchrun did not finish in {LAUNCH_TIMEOUT_S} s:\n{(error.stderr or '')[-4000:]}")
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{done.stderr[-6000:]}"
    from diffusiongemma import DiffusionGemmaForBlockDiffusion

    single = compute(DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir))
    ranks = {m: [torch.load(out_dir / f"{m}.rank{r}.pt") for r in (0, 1)] for m in MODES}
    return ranks, single


@pytest.mark.parametrize("mode", MODES)
def test_every_rank_returns_the_same_answer(runs, mode):
    rank0, rank1 = runs[0][mode]
    for key in ("logits", "sc_logits", "fast", "reference"):
        assert torch.equal(rank0[key], rank1[key]), key


@pytest.mark.parametrize("mode", MODES)
def test_tokens_equal_a_single_process(runs, mode):
    rank0, single = runs[0][mode][0], runs[1]
    assert torch.equal(rank0["fast"], single["fast"])  # sampling="fast", seeds [11, 12], mixed batching
    assert torch.equal(rank0["reference"], single["reference"])  # reference sampling, global RNG seeded alike


@pytest.mark.parametrize("mode", MODES)
def test_logits_equal_a_single_process_within_tolerance(runs, mode):
    rank0, single = runs[0][mode][0], runs[1]
    assert rank0["logits"].shape == single["logits"].shape  # the gathered head: all V logits on every rank
    torch.testing.assert_close(rank0["logits"], single["logits"], **LOGITS_TOLERANCE)
    torch.testing.assert_close(rank0["sc_logits"], single["sc_logits"], **LOGITS_TOLERANCE)


def test_tensor_parallelism_shards_attention_mlp_experts_and_head(runs):
    placed = runs[0]["tp"][0]["placements"]
    layer = "model.decoder.layers.5."  # the full-attention layer (no v_proj)
    assert placed[layer + "self_attn.q_proj.weight"] == "(Shard(dim=0),)"
    assert placed[layer + "self_attn.o_proj.weight"] == "(Shard(dim=1),)"
    assert placed[layer + "mlp.down_proj.weight"] == "(Shard(dim=1),)"
    assert "_StridedShard(dim=1" in placed[layer + "experts.gate_up_proj"]  # gate and up rows split alike
    assert placed["model.decoder.embed_tokens.weight"] == "(Shard(dim=0),)"  # tied to lm_head: vocab slices
    assert placed["model.decoder.layers.0.router.proj.weight"] == ""  # replicated


@pytest.mark.parametrize("mode", ["ep", "ep_a2a"])
def test_expert_parallelism_splits_experts_and_keeps_attention_whole(runs, mode):
    placed = runs[0][mode][0]["placements"]
    assert placed["model.decoder.layers.0.experts.gate_up_proj"] == "(Shard(dim=0),)"  # 2 of the 4 experts
    assert placed["model.decoder.layers.0.experts.down_proj"] == "(Shard(dim=0),)"
    assert placed["model.decoder.layers.0.self_attn.q_proj.weight"] == ""
    assert placed["model.decoder.embed_tokens.weight"] == ""
