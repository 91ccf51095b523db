#!/usr/bin/env bash
# Generated tokens/s of DiffusionGemma at the 26B-A4B shapes (random bf16 weights) on 1, 2, 4 and 8 GPUs (as many as
# are present), for tensor parallelism (tp), expert parallelism (ep) and both (tp_ep), through transformers'
# DistributedConfig (see docs/distributed.md); prints a table. One GPU runs the unsharded model as the baseline.
#
#   benchmarks/multi_gpu.sh                         # on a machine with >= 2 GPUs
#   benchmarks/multi_gpu.sh -- --batch 4 --steps 12 # arguments after -- go to benchmarks/multi_gpu.py
#   benchmarks/multi_gpu.sh --cpu-dry-run           # 1 and 2 CPU processes (gloo) at toy shapes: checks the script
#   benchmarks/multi_gpu.sh --out DIR               # keep each run's JSON and log in DIR (default: a temp folder)
# Environment: PYTHON (default python), RUN_TIMEOUT seconds per run (default 1200).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
dry=0 out="" extra=()
while (($#)); do
  case "$1" in
    --cpu-dry-run) dry=1; shift ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "multi_gpu.sh: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
if ((dry)); then
  gpus=2
  extra=(--tiny --steps 2 --canvases 1 --prompt 16 --repeats 1 "${extra[@]}")
  export CUDA_VISIBLE_DEVICES=""
else
  gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)') \
    || { echo "multi_gpu.sh: '$PY' cannot import torch (set PYTHON)" >&2; exit 1; }
  if ((gpus < 2)); then
    echo "multi_gpu.sh: needs at least 2 CUDA GPUs, found $gpus. On one GPU run benchmarks/gpu_26b_shapes.py;" \
         "--cpu-dry-run checks this script on CPU." >&2
    exit 1
  fi
fi
out=${out:-$(mktemp -d)}
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

run() {  # run N PLAN: one row of the table
  local n=$1 plan=$2 json="$out/$1-$2.json" log="$out/$1-$2.log" cmd rc
  if ((n == 1)); then
    cmd=("$PY" benchmarks/multi_gpu.py --plan none)
  else
    cmd=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" benchmarks/multi_gpu.py --plan "$plan")
  fi
  echo "== $n GPU(s), $plan: ${cmd[*]} ${extra[*]}"
  timeout "${RUN_TIMEOUT:-1200}" "${cmd[@]}" --json "$json" "${extra[@]}" >"$log" 2>&1
  rc=$?
  if ((rc != 0)); then
    echo "{\"gpus\": $n, \"plan\": \"$plan\", \"failed\": \"exit $rc, see $log\"}" >"$json"
  fi
}

run 1 none
for n in 2 4 8; do
  ((n <= gpus)) || break
  for plan in tp ep tp_ep; do run "$n" "$plan"; done
done

"$PY" - "$out" <<'PYEOF'
import glob, json, os, sys
rows = [json.load(open(p)) for p in glob.glob(os.path.join(sys.argv[1], "*.json"))]
rows.sort(key=lambda r: (r["gpus"], r["plan"]))
base = next((r["tokens_per_s"] for r in rows if r["gpus"] == 1 and "tokens_per_s" in r), None)
first = next((r for r in rows if "tokens_per_s" in r), {})
print(f"\n{first.get('shapes', '?')} shapes, {first.get('dtype', '?')}, batch {first.get('batch', '?')}, "
      f"{first.get('steps', '?')} steps/canvas, prompt {first.get('prompt', '?')}, {first.get('device', '?')}, "
      f"torch {first.get('torch', '?')}; results in {sys.argv[1]}")
print(f"{'GPUs':>4}  {'plan':<6} {'tokens/s':>9} {'vs 1 GPU':>8} {'peak GiB/GPU':>12}  note")
for r in rows:
    if "tokens_per_s" in r:
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        peak = f"{r['peak_gib_per_gpu']:.1f}" if r.get("peak_gib_per_gpu") is not None else "-"
        print(f"{r['gpus']:>4}  {r['plan']:<6} {r['tokens_per_s']:>9.1f} {ratio:>8} {peak:>12}")
    else:
        print(f"{r['gpus']:>4}  {r['plan']:<6} {'-':>9} {'-':>8} {'-':>12}  {r.get('skipped') or r.get('failed')}")
PYEOF
