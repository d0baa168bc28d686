#!/usr/bin/env bash
# A one-node Slurm "cluster" on this machine, for trying sweeps and running the Slurm tests.
#
#   slurm/dev-cluster.sh start    write the config (if ours or absent), start munged, slurmctld, slurmd
#   slurm/dev-cluster.sh stop     stop the daemons this script started, by the pids it recorded
#   slurm/dev-cluster.sh status   which of them run, and `sinfo`
#
# Needs root and the Debian packages: apt-get install -y slurmctld slurmd slurm-client munge
# (`make slurm` does that). One node named after `hostname -s` with all its CPUs, one default
# partition `debug`, no accounting (submitit's sacct warnings are harmless), no cgroups.
# A /etc/slurm/slurm.conf that this script did not write is never overwritten: set
# DISTFL_DEV_SLURM_FORCE=1 to replace it.
set -euo pipefail

STATE=${DISTFL_DEV_SLURM_STATE:-/var/lib/distfl-dev-slurm}   # spool dirs, logs, pids
CONF=/etc/slurm/slurm.conf
KEY=/etc/munge/munge.key
MARK="# distfl dev cluster (slurm/dev-cluster.sh)"
HOST=$(hostname -s)

die() { echo "dev-cluster: $*" >&2; exit 1; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (it starts munged, slurmctld and slurmd)"
}

write_conf() {
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF" && [ "${DISTFL_DEV_SLURM_FORCE:-0}" != 1 ]; then
    die "$CONF exists and was not written by this script; refusing to replace it (DISTFL_DEV_SLURM_FORCE=1 does)"
  fi
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" "$STATE/log" "$STATE/run"
  local cpus mem
  cpus=$(nproc --all)  # --all: plain nproc obeys OMP_NUM_THREADS, which would shrink the node
  mem=$(awk '/MemTotal/ {m = int($2 / 1024 / 2); print (m > 8000 ? 8000 : m)}' /proc/meminfo)
  cat > "$CONF" <<EOF
$MARK
ClusterName=distfl-dev
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# Seconds between the SIGTERM of a preemption, requeue or cancel and the SIGKILL.
KillWait=30
MinJobAge=300
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
NodeName=$HOST CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  need_root
  for bin in munged slurmctld slurmd sinfo sbatch srun; do
    command -v "$bin" >/dev/null || [ -x "/usr/sbin/$bin" ] || \
      die "$bin not found; install Slurm with: apt-get install -y slurmctld slurmd slurm-client munge (or: make slurm)"
  done
  write_conf

  if [ ! -s "$KEY" ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of="$KEY" bs=1024 count=1 status=none
  fi
  chown munge:munge "$KEY" /etc/munge && chmod 400 "$KEY"
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  if alive /run/munge/munged.pid; then
    # A munged that something else started (the package's init script): use it, and leave it running.
    [ -f "$STATE/run/munged.pid" ] || echo "dev-cluster: using the munged already running"
  else
    # munged writes its own pid file into /run/munge; keep a copy where stop looks.
    runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
    cp /run/munge/munged.pid "$STATE/run/munged.pid"
  fi
  # slurmd and slurmctld find each other by this name.
  if ! getent hosts "$HOST" >/dev/null; then
    echo "127.0.0.1 $HOST  # added by distfl slurm/dev-cluster.sh" >> /etc/hosts
  fi

  # -c: start with no jobs left over from an earlier run of the dev cluster.
  alive "$STATE/run/slurmctld.pid" || /usr/sbin/slurmctld -c
  alive "$STATE/run/slurmd.pid" || /usr/sbin/slurmd
  for _ in $(seq 100); do
    state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
    case "$state" in
      idle*|mixed*|alloc*) echo "dev-cluster: up: node $HOST ($(nproc --all) CPUs), partition debug"; return 0 ;;
      down*|drain*) scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.3
  done
  die "Slurm did not come up within 30 s; see $STATE/log/slurmctld.log and $STATE/log/slurmd.log"
}

stop() {
  need_root
  for name in slurmd slurmctld munged; do
    local pidfile="$STATE/run/$name.pid"
    if alive "$pidfile"; then
      local pid
      pid=$(cat "$pidfile")
      kill "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      echo "dev-cluster: stopped $name (pid $pid)"
    fi
    rm -f "$pidfile"
  done
}

status() {
  local up=0
  for name in munged slurmctld slurmd; do
    if alive "$STATE/run/$name.pid"; then
      echo "$name: running (pid $(cat "$STATE/run/$name.pid"))"; up=$((up + 1))
    else
      echo "$name: not running"
    fi
  done
  [ "$up" = 3 ] && sinfo
  [ "$up" = 3 ]
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
