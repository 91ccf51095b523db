#!/usr/bin/env bash
# One GPU check for a freshly lent machine: every CUDA-only test (`pytest -m cuda`, tests/cuda/), the 26B-shape
# benchmark, the CUDA-graph denoising pass against eager (cuda_graph_pass.py) and the server under load with and
# without --compile (and --compile-mode reduce-overhead; serve_load.py on the Sudoku demo model), in under 10 minutes
# on one GPU, ending with ONE summary table (group, result, time; benchmark numbers).
#
#   bash benchmarks/gpu_check.sh --dry-run        # list the steps and their time limits; runs nothing (any machine)
#   bash benchmarks/gpu_check.sh --fetch-wheels   # on a machine with a package registry: fill wheels/ (see below)
#   bash benchmarks/gpu_check.sh                  # on the GPU machine
#
# The GPU machine has CUDA torch 2.11 and transformers 5.17 and no network. The check builds a virtual environment
# with --system-site-packages (the image's CUDA torch stays in use), installs the wheels found in wheels/ (pinned
# transformers 5.23 and compressed-tensors with the few dependencies the image lacks) without an index, then installs
# this package with --no-deps. Fill wheels/ (gitignored) beforehand on a machine with a registry:
#
#   bash benchmarks/gpu_check.sh --fetch-wheels
#
# which runs `pip download --no-deps` for the pure-Python wheels (transformers==5.23.0, compressed-tensors==0.20.1,
# pydantic, annotated-types, typing-inspection, typing-extensions, loguru) and, for CPython 3.12 on manylinux x86-64
# (the GPU image's Python), the two compiled ones (pydantic-core, regex). With the device tool, carry wheels/.
#
# The image's python3 is itself a virtual environment (/opt/torch/.venv), and a venv made from a venv does not see the
# outer one's packages even with --system-site-packages; a .pth file in the new venv adds the image's site-packages
# after its own, so the carried wheels shadow the image's versions and everything else (torch, pip) comes from it.
#
# Options: --wheels DIR (default wheels/), --venv DIR (default /tmp/diffusiongemma-gpu-venv), --out DIR (logs and the
# JUnit file; default $OUT if set, else /tmp/gpu_check). Environment: PYTHON (default python3), BENCH_ARGS (arguments
# of gpu_26b_shapes.py). Every step has its own time limit; a failed step is reported in the table and the next one
# still runs. Exit status: 0 when every step passed, 1 otherwise.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$REPO/wheels"
VENV="/tmp/diffusiongemma-gpu-venv"
LOGS="${OUT:-/tmp/gpu_check}"
MODE=run
PY="${PYTHON:-python3}"  # the image's Python (holds CUDA torch)
BENCH_ARGS="${BENCH_ARGS:---steps 8 --canvases 2 --prompt 128}"

PURE_WHEELS=(transformers==5.23.0 compressed-tensors==0.20.1 pydantic==2.14.4 annotated-types==0.8.0
             typing-inspection==0.4.5 typing-extensions==4.16.0 loguru==0.7.3)
BINARY_WHEELS=(pydantic-core==2.50.5 regex==2026.11.19 outlines-core==0.2.14)

while [[ $# -gt 0 ]]; do
    case "$1" in
        --dry-run) MODE=dry ;;
        --fetch-wheels) MODE=fetch ;;
        --wheels) WHEELS="$(cd "$2" && pwd)"; shift ;;
        --venv) VENV="$2"; shift ;;
        --out) LOGS="$2"; shift ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [[ $MODE == fetch ]]; then
    mkdir -p "$WHEELS"
    "$PY" -m pip download --no-deps -d "$WHEELS" "${PURE_WHEELS[@]}"
    "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$WHEELS" "${BINARY_WHEELS[@]}"
    ls -l "$WHEELS"
    exit 0
fi

# ---- the steps: name, time limit (s), command (run with bash -c in the repo root) --------------------------------
# Limits add up to 600 s, the 10-minute budget (the tests' time goes mostly to four torch.compile runs; the server
# step, last, compiles the demo model's row buckets 1, 2, 4 in two modes).
STEP_NAMES=(env gpu cuda-tests benchmark cuda-graph serve)
STEP_LIMITS=(60 15 240 105 50 130)
STEP_COMMANDS=(
    "rm -rf '$VENV' && $PY -m venv --system-site-packages --without-pip '$VENV' \
&& $PY -c 'import site; print(*site.getsitepackages(), sep=chr(10))' \
> \$('$VENV/bin/python' -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/image_site_packages.pth \
&& ls '$WHEELS'/*.whl >/dev/null \
&& '$VENV/bin/python' -m pip install -q --no-index --no-deps --no-compile '$WHEELS'/*.whl \
&& { '$VENV/bin/python' -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>'$LOGS/editable-install.err' \
|| echo 'editable install failed: the tests import the package through PYTHONPATH'; } \
&& '$VENV/bin/python' -c 'import torch, transformers, compressed_tensors, diffusiongemma; \
print(\"torch\", torch.__version__, \"transformers\", transformers.__version__, \"compressed-tensors\", \
compressed_tensors.__version__, \"diffusiongemma from\", diffusiongemma.__file__)'"
    "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
&& '$VENV/bin/python' -c 'import torch; assert torch.cuda.is_available(), \"torch sees no GPU\"; \
print(torch.cuda.get_device_name(), torch.cuda.get_device_capability())'"
    "'$VENV/bin/python' -m pytest -m cuda tests/cuda -q -rfEs -p no:cacheprovider -o junit_family=xunit1 \
--junitxml='$LOGS/junit.xml' \$('$VENV/bin/python' -c 'import pytest_timeout' 2>/dev/null && echo --timeout=150)"
    "'$VENV/bin/python' benchmarks/gpu_26b_shapes.py $BENCH_ARGS"
    "'$VENV/bin/python' benchmarks/cuda_graph_pass.py"
    "'$VENV/bin/python' benchmarks/serve_load.py --device cuda --modes default compile compile-reduce-overhead \
--levels 1 4 --requests 8 --max-batch-size 4 --timeout 100"
)

if [[ $MODE == dry ]]; then
    echo "gpu_check.sh --dry-run: would run in $REPO (logs in $LOGS), nothing is executed"
    for i in "${!STEP_NAMES[@]}"; do
        printf 'step %d  %-11s limit %4ss  %s\n' "$((i + 1))" "${STEP_NAMES[$i]}" "${STEP_LIMITS[$i]}" \
            "$(tr -s ' ' <<<"${STEP_COMMANDS[$i]}")"
    done
    echo "then: one summary table (JUnit per test file from $LOGS/junit.xml, benchmark lines from its log)"
    exit 0
fi

cd "$REPO"
mkdir -p "$LOGS"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
RESULTS=()  # "name|result|seconds"
for i in "${!STEP_NAMES[@]}"; do
    name="${STEP_NAMES[$i]}"
    echo "=== step $((i + 1)): $name (limit ${STEP_LIMITS[$i]} s)"
    start=$(date +%s)
    status=0
    timeout --kill-after=10 "${STEP_LIMITS[$i]}" bash -c "${STEP_COMMANDS[$i]}" 2>&1 | tee "$LOGS/$name.log" \
        || status=${PIPESTATUS[0]}
    seconds=$(($(date +%s) - start))
    case $status in
        0) result=passed ;;
        124|137) result="TIMEOUT" ;;
        *) result="FAILED (exit $status)" ;;
    esac
    RESULTS+=("$name|$result|$seconds")
done

# ---- the summary table --------------------------------------------------------------------------------------------
SUMMARY_PY='
import os, re, sys, xml.etree.ElementTree as ET
logs, rows = sys.argv[1], [r.split("|") for r in sys.argv[2:]]
table = [("step / test group", "result", "time")]
for name, result, seconds in rows:
    table.append((name, result, seconds + " s"))
    if name == "cuda-tests" and os.path.exists(os.path.join(logs, "junit.xml")):
        groups = {}
        for case in ET.parse(os.path.join(logs, "junit.xml")).iter("testcase"):
            group = case.get("file") or case.get("classname", "?").replace(".", "/") + ".py"
            g = groups.setdefault(group, {"passed": 0, "failed": 0, "skipped": 0, "time": 0.0})
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped" and outcome == "passed":
                    outcome = "skipped"
            g[outcome] += 1
            g["time"] += float(case.get("time", 0))
        for group, g in sorted(groups.items()):
            counts = ", ".join(f"{g[k]} {k}" for k in ("passed", "failed", "skipped") if g[k])
            seconds = g["time"]
            table.append(("  " + group.split("/")[-1].removesuffix(".py"), counts, f"{seconds:.1f} s"))
    if name in ("benchmark", "cuda-graph") and os.path.exists(os.path.join(logs, name + ".log")):
        for line in open(os.path.join(logs, name + ".log")):
            m = re.match(r"(decoder pass|generate|bytes per pass|peak memory|cuda graph pass)\b(.*)", line.strip())
            if m:
                table.append(("  " + m.group(1), m.group(2).lstrip(" :"), ""))
    if name == "serve" and os.path.exists(os.path.join(logs, name + ".log")):
        for line in open(os.path.join(logs, name + ".log")):
            m = re.match(r"\| (default|compile\S*) \| (\d+) \| ([\d.]+) \| (\d+) \|.*\| ([\d./-]+) \| \d+/\d+ \|$",
                         line.strip())
            w = re.match(r"serve load (\S+): warm-up (\S+ s)", line.strip())
            if m:
                table.append((f"  {m.group(1)}, {m.group(2)} clients",
                              f"{m.group(3)} req/s, {m.group(4)} tok/s, full response p50/p90/p99 {m.group(5)} s", ""))
            elif w:
                table.append((f"  {w.group(1)} warm-up", w.group(2), ""))
width = [max(len(r[i]) for r in table) for i in range(3)]
print()
for i, r in enumerate(table):
    print("| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |")
    if i == 0:
        print("|" + "|".join("-" * (w + 2) for w in width) + "|")
'
echo
echo "=== summary (logs in $LOGS)"
PYTHON_FOR_TABLE=python3
[[ -x "$VENV/bin/python" ]] && PYTHON_FOR_TABLE="$VENV/bin/python"
"$PYTHON_FOR_TABLE" -c "$SUMMARY_PY" "$LOGS" "${RESULTS[@]}" | tee "$LOGS/summary.md" || {
    echo "(table script failed; raw results)"; printf '%s\n' "${RESULTS[@]}"; }

for r in "${RESULTS[@]}"; do
    [[ "${r#*|}" == passed\|* ]] || exit 1
done
exit 0
