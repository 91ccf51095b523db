"""benchmarks/gpu_check.sh: `--dry-run` lists every step with its time limit and runs nothing (works without a GPU);
the limits fit the 10-minute budget; unknown arguments are refused."""

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


def run(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **env})


def test_dry_run_lists_the_steps_without_running_them(tmp_path):
    venv = tmp_path / "venv"
    out = run("--dry-run", "--venv", str(venv), "--out", str(tmp_path / "logs"))
    assert out.returncode == 0, out.stderr
    steps = re.findall(r"^step (\d)  (\S+)\s+limit\s+(\d+)s  (.*)$", out.stdout, flags=re.M)
    assert [name for _, name, _, _ in steps] == ["env", "gpu", "cuda-tests", "benchmark", "cuda-graph", "serve"]
    commands = {name: command for _, name, _, command in steps}
    assert "venv --system-site-packages" in commands["env"] and "--no-index --no-deps" in commands["env"]
    assert "/wheels'/*.whl" in commands["env"] and "-e ." in commands["env"]
    assert "pytest -m cuda tests/cuda" in commands["cuda-tests"] and "--junitxml" in commands["cuda-tests"]
    assert "benchmarks/gpu_26b_shapes.py" in commands["benchmark"]
    assert "benchmarks/cuda_graph_pass.py" in commands["cuda-graph"]
    assert "benchmarks/serve_load.py --device cuda --modes default compile compile-reduce-overhead" in commands["serve"]
    assert sum(int(limit) for _, _, limit, _ in steps) <= 10 * 60  # 15 device minutes a task, starting included
    assert not venv.exists() and not (tmp_path / "logs").exists()  # nothing ran


def test_benchmark_arguments_and_wheel_folder_are_passed_on(tmp_path):
    out = run("--dry-run", "--wheels", str(tmp_path), BENCH_ARGS="--steps 3")
    assert f"'{tmp_path}'/*.whl" in out.stdout
    assert "gpu_26b_shapes.py --steps 3" in out.stdout


def test_unknown_argument_is_refused():
    out = run("--dry-rn")
    assert out.returncode == 2 and "unknown argument '--dry-rn'" in out.stderr


def test_help_prints_the_header():
    out = run("--help")
    assert out.returncode == 0 and "serve_load.py" in out.stdout and "set -euo" not in out.stdout
