#!/usr/bin/env bash
# Multi-GPU verification run (issue 12), in one go, on a machine of several GPUs:
#   system.txt               nvidia-smi -L / topo -m, torch/NCCL versions, the safety variables
#   topology.json            gpubox gpus --local --json (NUMA nodes, NVLink vs PCIe pairs, gpus_for_tp 1,2,4,8)
#   probe.json               hwtune/probe.py: NVML facts, H2D/D2H/D2D per GPU, P2P every ordered pair,
#                            all-reduce busbw over each TP set
#   probe_report.json        gpubox probe --input probe.json --json (the verdict on it)
#   nccl_compare_<P>.json    gpubox probe --local --nccl-compare P (current env vs + profile vs the current
#                            env again = A/A noise floor, arms rotated over ROUNDS), with the A/B gate verdict
#                            (run.log: the same gate again from the recorded file, gpubox probe --input)
#   ablation.json, .png      gpubox tune ablate --local: each NCCL variable of ABLATE on its own (+VAR, all-VAR),
#                            repeats sized to the budget left (issue 18); skipped with fewer than 2 GPUs
# The device returns at most 8 files: keep it at that.
#   run.log                  what ran, how long, exit codes
#
# Read-only on the GPUs: no clock, MIG, persistence or PCIe config-space change anywhere.
# NVLink multicast stays off in every process (a program using it can take a shared host's GPUs
# out of service): the three variables are exported here, and the comparison force-sets them again
# in each child after applying the profile (hwtune/nccl_compare.py).
#
#   OUT=/some/dir bash benchmarks/multigpu_run.sh        # from the repository root
#   PROFILES="pcie-2numa" ROUNDS=1 QUICK=1 ...           # knobs (defaults below)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/multigpu-out}
PY=${PYTHON:-python3}
PROFILES=${PROFILES:-"pcie-2numa"}
ROUNDS=${ROUNDS:-3}      # arms rotate each round (A B A', B A' A, ...); medians are compared
ABLATE=${ABLATE:-pcie-2numa}    # profile to take apart ('' for none)
QUICK=${QUICK:-}
BUDGET=${BUDGET:-560}     # seconds for the whole script: the device allows 600 per command
mkdir -p "$OUT" || exit 2
LOG=$OUT/run.log
: > "$LOG"
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }

# Refuse to start without the safety, whatever the caller's environment did to it.
for kv in NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1; do
    [ "$(printenv "${kv%%=*}")" = "${kv#*=}" ] || { say "safety variable ${kv%%=*} is not ${kv#*=}: stop"; exit 2; }
done

# run NAME LIMIT_S OUTFILE CMD...: stdout to OUTFILE, stderr to the log, never past LIMIT_S nor
# past the script's BUDGET (a step that would start with under 20 s left is skipped, and says so).
run() {
    local name=$1 limit=$2 out=$3; shift 3
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 20 ]; then say "skip $name: only ${left}s of the ${BUDGET}s budget left"; return 124; fi
    [ "$limit" -gt "$left" ] && limit=$left
    say "start $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" > "$out" 2>> "$LOG"
    local rc=$?
    say "end $name rc=$rc in $((SECONDS - t0))s -> $(basename "$out") ($(wc -c < "$out") bytes)"
    return $rc
}

say "multigpu_run: out=$OUT python=$($PY -c 'import sys; print(sys.executable, sys.version.split()[0])' 2>&1)"
say "commit: $(git rev-parse --verify -q HEAD 2>/dev/null || echo unknown); profiles: $PROFILES; rounds: $ROUNDS; quick: ${QUICK:-no}"
$PY -c 'import click, rich, yaml' 2>> "$LOG" || say "WARNING: click/rich/yaml missing: gpubox commands will fail, probe.py still runs"

{
    echo "== date"; date -u
    echo "== safety"; env | grep -E '^(NCCL_|NVSHMEM_|TORCH_SYMM_MEM_)' | sort
    echo "== nvidia-smi -L"; timeout 30 nvidia-smi -L 2>&1
    echo "== nvidia-smi topo -m"; timeout 30 nvidia-smi topo -m 2>&1
    echo "== nvidia-smi nvlink --status"; timeout 30 nvidia-smi nvlink --status 2>&1 | head -200
    echo "== numa"; for f in /sys/bus/pci/devices/*/numa_node; do d=${f%/numa_node}; \
        [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && echo "${d##*/} class=$(cat "$d/class") numa=$(cat "$f")"; done
    echo "== lscpu"; lscpu 2>&1 | grep -iE 'numa|socket|model name'
    echo "== torch"; timeout 60 $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.nccl.version())' 2>&1
} > "$OUT/system.txt" 2>&1
say "system.txt written"

run topology 60 "$OUT/topology.json" $PY -m gpubox.cli gpus --local --json

# All-reduce sets: the gpus_for_tp pick for each TP size, plus the contiguous TP groups the probe
# uses by default (TP4 on 8 GPUs: 0-3 and 4-7), without duplicates.
SETS=$($PY - "$OUT/topology.json" <<'EOF' 2>> "$LOG"
import json, sys
from gpubox.hwtune.probe import default_sets
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    doc = {}
n = len(doc.get("gpus") or [])
sets = [t["gpus"] for t in doc.get("tp") or [] if t.get("fits") and len(t["gpus"]) > 1]
for s in default_sets(n):
    if s not in sets:
        sets.append(s)
print(";".join(",".join(map(str, s)) for s in sets))
EOF
)
say "all-reduce sets: ${SETS:-(default)}"
if [ -n "$SETS" ]; then
    run probe 180 "$OUT/probe.json" $PY hwtune/probe.py ${QUICK:+--quick} --allreduce-sets "$SETS" --indent 1
else
    run probe 180 "$OUT/probe.json" $PY hwtune/probe.py ${QUICK:+--quick} --indent 1
fi
run verdict 30 "$OUT/probe_report.json" $PY -m gpubox.cli probe --input "$OUT/probe.json" --json

# Each comparison: 2 x ROUNDS children; a hung child (NCCL waiting on a broken path) is killed
# after its share, so the comparison still writes its JSON with what the others measured.
CMP_LIMIT=${CMP_LIMIT:-200}
CHILD_T=$(( (CMP_LIMIT - 15) / (3 * ROUNDS) ))
[ "$CHILD_T" -lt 30 ] && CHILD_T=30
for p in $PROFILES; do
    run "nccl-compare $p" $CMP_LIMIT "$OUT/nccl_compare_$p.json" \
        $PY -m gpubox.cli probe --local --nccl-compare "$p" --rounds "$ROUNDS" --child-timeout "$CHILD_T" \
        ${QUICK:+--quick} --json
    $PY -m gpubox.cli probe --input "$OUT/nccl_compare_$p.json" --json 2>> "$LOG" | $PY -c \
        'import json,sys; print("gate from the recorded file:", json.load(sys.stdin)["summary"])' 2>&1 | tee -a "$LOG" >&2
done

# Ablation: as many repeats (2..4) as the budget left allows, from the comparison's time per child.
if [ -n "$ABLATE" ] && [ -n "$SETS" ]; then
    PER_CHILD=$($PY - "$OUT" $PROFILES <<'EOF' 2>> "$LOG"
import json, sys
try:
    d = json.load(open(f"{sys.argv[1]}/nccl_compare_{sys.argv[2]}.json"))
    n = sum(len(v) for v in d["child_env"].values())
    print(max(5, int(d["seconds"] / max(n, 1)) + 2))
except Exception:
    print(12)
EOF
)
    ARMS=8
    LEFT=$((BUDGET - SECONDS - 25))
    REP=$(( LEFT / (ARMS * PER_CHILD) ))
    [ "$REP" -gt 4 ] && REP=4
    say "ablation: ~${PER_CHILD}s per child, ${LEFT}s left -> ${REP} repeats"
    if [ "$REP" -ge 2 ]; then
        ABL_DIR=$(mktemp -d)
        run "ablate $ABLATE" $((LEFT + 20)) "$OUT/ablation.json" \
            $PY -m gpubox.cli tune ablate --local --profile "$ABLATE" --repeats "$REP" --sizes 1M,256M \
            --child-timeout 60 --out "$ABL_DIR" --json
        cp "$ABL_DIR/ablation.png" "$OUT/ablation.png" 2>> "$LOG"
    else
        say "skip ablation: under 2 repeats fit in the budget"
    fi
fi

# A short summary in the log (the figures the closing note needs).
$PY - "$OUT" <<'EOF' 2>&1 | tee -a "$LOG"
import glob, json, os, sys
out = sys.argv[1]
def load(n):
    try:
        return json.load(open(os.path.join(out, n)))
    except (OSError, ValueError):
        return None
t = load("topology.json") or {}
print("topology:", len(t.get("gpus") or []), "GPUs; NUMA", t.get("numa_nodes"), "; NVLink pairs",
      len((t.get("links") or {}).get("nvlink") or []), "/ PCIe-only", len((t.get("links") or {}).get("pcie") or []))
for c in t.get("tp") or []:
    print(f"  TP{c['tp']}: {c['cuda_visible_devices'] or '-'}  {c['reason']}")
r = load("probe_report.json") or {}
for s in r.get("steps") or []:
    if s["name"].startswith(("p2p", "allreduce")) or s["status"] != "ok":
        print(f"  {s['status']:7} {s['name']}: {s['detail']}")
for f in sorted(glob.glob(os.path.join(out, "nccl_compare_*.json"))):
    c = load(os.path.basename(f)) or {}
    print("compare", c.get("profile"), "class", c.get("topology_class"), "errors:", c.get("errors"))
    for row in c.get("rows") or []:
        print(f"  TP{row['tp']} {row['gpus']} {row['bytes']} B: {row['baseline']} -> {row['profile']} GB/s "
              f"x{row['ratio']}  (A/A {row.get('baseline_aa')})")
    print("  gate:", (c.get("gate") or {}).get("summary"))
a = load("ablation.json") or {}
for row in a.get("rows") or []:
    print(f"  ablate {row['metric']:32} {row['arm']:18} {row['mean']} +/-{row['ci95']}  "
          f"{row['delta_pct']}% +/-{row['delta_ci95_pct']} {row['significant']}")
EOF
say "done in ${SECONDS}s"
