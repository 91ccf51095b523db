"""benchmarks/multi_gpu.sh refuses cleanly without 2 GPUs and refuses unknown arguments (its --cpu-dry-run, which
runs 1 and 2 CPU processes at toy shapes, takes minutes here and is run by hand)."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "multi_gpu.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}  # no GPU visible, even on a GPU box
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


def test_fewer_than_two_gpus_is_refused_with_the_alternatives():
    out = run()
    assert out.returncode == 1
    assert "needs at least 2 CUDA GPUs, found 0" in out.stderr
    assert "benchmarks/gpu_26b_shapes.py" in out.stderr and "--cpu-dry-run" in out.stderr
    assert "==" not in out.stdout  # nothing ran


def test_unknown_argument_is_refused():
    out = run("--gpus", "4")
    assert out.returncode == 2 and "unknown argument '--gpus'" in out.stderr
