#!/bin/bash
# On a bare GPU machine, from the repo root, after bench/gpu_prepare.sh here (carry .whl and .gpu): every
# GPU measurement of docs/gpu.md in ONE call of about 6-7 minutes on an H100 or H200, each step under its
# own `timeout`, so one that hangs or fails costs only its own time. Results go to $OUT (default ./gpu_out),
# 7 files at most, written as each step ends (a call cut short still returns what was done):
#   test_cuda.txt        tests/integration/test_cuda.py with -n 3
#   cuda_step.txt        the step probe, bench/cuda_step.py
#   cross-device.json    packs of 1,10,25,50 beside pfl-research in 1-5 worker processes on the GPU
#   ranks.json           1, 2, 4 distfl ranks sharing the GPU (torchrun, gloo; packs of 50, 25, 13) vs one rank
#   whole-run.json       pfl-research's CIFAR-10 benchmark run (CIFAR_ROUNDS of its 1,500 rounds) and the quickstart
#   settings.json        the cross-device packs again under each of SETTINGS (only when SETTINGS names keys)
#   summary.md           every bench's markdown table, the failures' log tails, and the compact summary
# Knobs (environment): XD_ROUNDS, XD_REPEATS (cross-device), CIFAR_ROUNDS (default 300; 1500 = the whole run),
# XD_PACKS, PFL_COUNTS, RANKS, RANK_PACKS (the lists timed); DEVICE (default cuda; cpu: a dry run of the
# plumbing, with LIMIT_SCALE multiplying the steps' time limits and smaller lists);
# SETTINGS: space-separated overrides, each compared against the default on the cross-device packs, e.g.
#   SETTINGS="runtime.cuda_graphs=off runtime.tf32=true"   (the default; a setting the config does not know is
# skipped and said so). The cross-device and whole-run benches also take KEY=VALUE overrides directly.
set -u
source bench/gpu_setup.sh
DEVICE=${DEVICE:-cuda}; LIMIT_SCALE=${LIMIT_SCALE:-1}; XD_ROUNDS=${XD_ROUNDS:-5}; XD_REPEATS=${XD_REPEATS:-1}; CIFAR_ROUNDS=${CIFAR_ROUNDS:-300}
XD_PACKS=${XD_PACKS:-1,10,25,50}; PFL_COUNTS=${PFL_COUNTS-1,2,3,4,5}; RANKS=${RANKS:-1,2,4}; RANK_PACKS=${RANK_PACKS:-1,50}
SETTINGS=${SETTINGS-runtime.cuda_graphs=off runtime.tf32=true}
RES=$(mktemp -d); trap 'rm -rf "$RES"' EXIT; SUMMARY="$OUT/summary.md"; : > "$SUMMARY"
export DISTFL_PFL_PYTHON=python3
# The GPU, its driver and compute mode (pfl's workers need "Default", several processes on the GPU), torch's build.
{ echo "# GPU session $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null)"; echo
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total --format=csv,noheader 2>&1)"
  echo "torch: $(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())' 2>&1)"
  echo; } | tee -a "$SUMMARY"
# bench NAME SECONDS ARGS...: `distfl bench ARGS --out` into $RES, then the JSON into $OUT (unless KEEP=0)
# and its table (or, when it failed, its log's tail) into summary.md.
bench(){
  local name=$1 limit=$(( $2 * LIMIT_SCALE )); shift 2
  timeout "$limit" python3 -m distfl bench "$@" --out "$RES/$name.json" > "$RES/$name.log" 2>&1
  local rc=$?
  if [ -s "$RES/$name.json" ]; then [ "${KEEP:-1}" = 1 ] && cp "$RES/$name.json" "$OUT/"; cat "$RES/$name.md" >> "$SUMMARY"
  else printf '\n## %s failed (exit %s%s)\n\n```\n%s\n```\n' "$name" "$rc" "$([ $rc = 124 ] && echo ', timed out')" \
         "$(tail -25 "$RES/$name.log")" >> "$SUMMARY"; fi
  echo "" >> "$SUMMARY"; tail -4 "$RES/$name.log"
}

XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${TEST_WORKERS:-3}")  # pytest-xdist where the machine has it
step "tests/integration/test_cuda.py (${XDIST:-no -n: pytest-xdist missing})"
timeout $(( 150 * LIMIT_SCALE )) python3 -m pytest -q -p no:cacheprovider -p no:benchmark $XDIST -rs tests/integration/test_cuda.py \
  > "$OUT/test_cuda.txt" 2>&1
tail -4 "$OUT/test_cuda.txt"

if [ "${STEP_PROBE:-1}" = 1 ]; then  # STEP_PROBE=0 skips it
  step "step probe (bench/cuda_step.py)"
  PYTHONPATH=.:bench timeout $(( 100 * LIMIT_SCALE )) python3 bench/cuda_step.py > "$OUT/cuda_step.txt" 2>&1; tail -9 "$OUT/cuda_step.txt" | head -8
fi

step "cross-device: packs $XD_PACKS; pfl-research in ${PFL_COUNTS:-no} process(es) sharing the GPU"
bench cross-device 170 --suite cross-device --device "$DEVICE" --rounds "$XD_ROUNDS" --repeats "$XD_REPEATS" \
  --pack-sizes "$XD_PACKS" --pfl-processes "$PFL_COUNTS"

step "distfl ranks sharing the GPU: $RANKS (packs of the largest of $RANK_PACKS, at most a rank's share) against one rank"
bench ranks 110 --suite cross-device --device "$DEVICE" --rounds "$XD_ROUNDS" --repeats 1 --pack-sizes "$RANK_PACKS" \
  --pfl-processes "" --ranks "$RANKS"

step "whole runs: pfl-research's CIFAR-10 benchmark config ($CIFAR_ROUNDS of 1,500 rounds), the quickstart"
bench whole-run 150 --suite whole-run --device "$DEVICE" --rounds "$CIFAR_ROUNDS"

# Settings to compare (runtime.cuda_graphs, ...): the cross-device packs under each that the config knows.
KNOWN=""; for s in $SETTINGS; do
  if python3 -c "import sys; from distfl.config import load_config; load_config(None, [sys.argv[1]])" "$s" 2>/dev/null
  then KNOWN="$KNOWN $s"; else echo "setting $s: not a valid override in this tree, skipped" | tee -a "$SUMMARY"; fi
done
if [ -n "$KNOWN" ]; then
  step "settings compared on the cross-device packs:$KNOWN"
  for s in $KNOWN; do
    KEEP=0 bench "settings_${s//[^a-z0-9_]/_}" 60 --suite cross-device --device "$DEVICE" --rounds "$XD_ROUNDS" --repeats 1 \
      --pack-sizes "$RANK_PACKS" --pfl-processes "" "$s"
  done
  python3 - "$RES" "$OUT/settings.json" <<'PY'
import glob, json, sys
runs = {json.load(open(f))["extra_overrides"][0]: json.load(open(f)) for f in glob.glob(f"{sys.argv[1]}/settings_*.json")}
json.dump(runs, open(sys.argv[2], "w"), indent=1)
PY
fi

step "summary"
python3 - "$OUT" <<'PY' | tee -a "$SUMMARY"
import json, os, re, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
print("\n## Summary\n")
try:
    tail = open(os.path.join(out, "test_cuda.txt")).read().strip().splitlines()
    print(f"- tests/integration/test_cuda.py: {tail[-1] if tail else 'no output'}")
except OSError:
    print("- tests/integration/test_cuda.py: no output")
try:
    lines = open(os.path.join(out, "cuda_step.txt")).read().strip().splitlines()
except OSError:
    lines = []
step = None
for line in reversed(lines):  # its JSON line, wherever warnings put it
    try:
        step = json.loads(line)
        break
    except ValueError:
        continue
if isinstance(step, dict) and "ms_per_client_step" in step:
    print(f"- step probe on {step['device']}, ms per client step: "
          + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in step["ms_per_client_step"].items()))
else:
    print("- step probe: no result; its last lines: " + " | ".join(lines[-3:]))
xd = load("cross-device.json")
if xd:
    print(f"- cross-device on {xd['gpu'] or xd['device']}: s/round by pack size "
          + ", ".join(f"{p}: {v:.3f}" for p, v in xd["median_s_per_round"].items()))
    pfl = {n: r["s_per_round"] for n, r in xd["pfl_research_processes"].items() if isinstance(r, dict)}
    why = {n: r for n, r in xd["pfl_research_processes"].items() if not isinstance(r, dict)}
    print("- pfl-research s/round by processes: " + (", ".join(f"{n}: {v:.3f}" for n, v in pfl.items()) or "-")
          + "".join(f"; {n}: {r}" for n, r in why.items()))
    b = xd["best"]
    if "speedup_vs_pfl" in b:
        print(f"- best: distfl {b['distfl']} {b['distfl_s_per_round']:.3f} s/round vs pfl-research "
              f"{b['pfl_processes']} process(es) {b['pfl_s_per_round']:.3f}: {b['speedup_vs_pfl']:.2f}x (target 10x)")
ranks = load("ranks.json")
if ranks and ranks.get("ranks_sharing_device"):
    r = ranks["ranks_sharing_device"]
    largest = max(ranks["median_s_per_round"], key=int)
    print("- ranks sharing the GPU: "
          + ", ".join(f"{n} (packs of {r['pack_size'][n]}): {v:.3f} s/round {r['client_updates_per_s'][n]:.0f} updates/s"
                      for n, v in r["median_s_per_round"].items())
          + f"; one rank in-process, packs of {largest}: {ranks['median_s_per_round'][largest]:.3f} s/round"
          + f"; same model at equal pack sizes: {r['bit_identical_at_equal_pack_size']}")
whole = load("whole-run.json")
for name, w in (whole or {}).get("runs", {}).items():
    proj = "" if w["rounds"] == w["full_rounds"] else f", whole run projected {w['full_run_training_s']:.1f} s"
    print(f"- {name}: {w['rounds']} rounds, training {w['training_s']:.2f} s (first round {w['first_round_s']:.2f}), "
          f"{w['client_updates_per_s']:.0f} client updates/s{proj}, target {w['target']}: "
          f"{'met' if w['met'] else 'not met'}; acc {w['final_test_acc']}, pack {w['pack_size']}")
for setting, s in (load("settings.json") or {}).items():
    print(f"- {setting}: s/round by pack size " + ", ".join(f"{p}: {v:.3f}" for p, v in s["median_s_per_round"].items()))
PY
ls -la "$OUT"
step done
