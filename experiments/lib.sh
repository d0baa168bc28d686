# Sourced by the experiment scripts. `ended DIR` is true when DIR holds a run that ended (its summary.json
# says completed or diverged; distfl.report.ended): such a run is skipped. A run that was stopped, killed
# or failed also leaves a summary.json (status stopped, running or failed) and is run again.
ended() {
  python -c 'import sys; from distfl.report import ended; sys.exit(0 if ended(sys.argv[1]) else 1)' "$1"
}

# `run_each CONFIG OUT SEED NAME ...`: trains CONFIG once per NAME, with the keys the calling script's
# `overrides NAME` prints (it fails on an unknown name: every name is checked before anything runs), in
# OUT/NAME_sSEED, its command in OUT/NAME_sSEED.cmd and its output in .log; JOBS (2) at a time, each with one
# thread at nice 10. EXTRA: keys put before every run's output.dir. A run that ended is skipped.
run_each() {
  local config=$1 out=$2 seed=$3 name
  shift 3
  for name in "$@"; do overrides "$name" > /dev/null || return; done
  mkdir -p "$out"
  export OMP_NUM_THREADS=1
  for name in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do wait -n || true; done
    _train_one "$config" "$out/${name}_s$seed" "seed=$seed ${EXTRA:+$EXTRA }" "$(overrides "$name")" &
  done
  wait
}
_train_one() {  # CONFIG DIR KEYS_BEFORE KEYS_AFTER
  ended "$2" && return
  local cmd="python -m distfl train $1 $3output.dir=$2 $4"
  echo "$cmd" > "$2.cmd"
  nice -n 10 $cmd --overwrite > "$2.log" 2>&1
}
