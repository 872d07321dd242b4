#!/usr/bin/env bash
# A one-node SLURM on this machine, for the test suite and for trying the launch scripts:
#   eval "$(bash scripts/slurm_local.sh start [DIR])"   start it; prints `export SLURM_CONF=DIR/slurm.conf`
#   sbatch -N 1 --ntasks-per-node=2 --cpus-per-task=1 scripts/launch/submit_slurm.sh jax cpu_tiny
#   bash scripts/slurm_local.sh status [DIR]              the daemons' pids and sinfo's line
#   bash scripts/slurm_local.sh stop [DIR]                cancel its jobs, stop the daemons it started
# DIR (default: $DLAS_SLURM_DIR, else /tmp/dlas-slurm) holds everything: the config, munge's key and
# socket, slurmctld's state, slurmd's spool, the logs and the daemons' pid files. The node is this host
# with its CPUs and memory and no GPUs; the partition `debug` is the default. The daemons listen on free
# ports picked at start, so several such clusters (one per DIR) run side by side; `stop` kills only the
# pids recorded in DIR. Where slurm-wlm or munge is missing, start installs them with apt-get (Debian's
# packages; needs root). The daemons run as root (SlurmUser=root), as the packages' own services do.
# DLAS_SLURM_CPUS=N declares N CPUs (default: the host's), so a job may run N tasks on fewer cores (the
# tests run 4 tasks on 2 cores); with more than the host has, tasks are not bound to cores.
set -euo pipefail
cmd=${1:-}
dir=${2:-${DLAS_SLURM_DIR:-/tmp/dlas-slurm}}
say() { echo "slurm_local: $*" >&2; }
die() { echo "error: slurm_local: $*" >&2; exit 1; }

usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

install_missing() {  # one installation at a time: two test workers may start their clusters together
  local lock=${TMPDIR:-/tmp}/dlas-slurm-install.lock
  exec 9>"$lock" && flock -w 900 9 || die "waited 900 s for another installation ($lock)"
  install_unlocked
  flock -u 9 && exec 9>&-  # the daemons started next must not hold the lock
}

install_unlocked() {
  local missing=()
  command -v munged >/dev/null || missing+=(munge)
  for b in slurmctld slurmd sbatch; do command -v $b >/dev/null || { missing+=(slurm-wlm); break; }; done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  [[ $(id -u) -eq 0 ]] || die "${missing[*]} not installed and not root: apt-get install ${missing[*]} as root"
  command -v apt-get >/dev/null || die "${missing[*]} not installed and no apt-get here: install them"
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq -o DPkg::Lock::Timeout=300 >&2 || die "apt-get update failed"
  # the packages' services stay stopped (no init system starts them here; start runs its own daemons)
  apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
}

free_port() {  # a port nothing listens on, in 20000-39999
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 20000))
    (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo $p; return; }
  done
  die "no free port found"
}

pid_of() {  # the recorded pid of daemon $1, if that process still runs that program
  local f="$dir/$1.pid" pid
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  [[ -r /proc/$pid/comm && $(</proc/$pid/comm) == "$1" ]] || return 1
  echo "$pid"
}

write_config() {
  local host cpus mem
  host=$(hostname -s)
  cpus=${DLAS_SLURM_CPUS:-$(nproc --all)}
  local bind=task/affinity overrides=""
  if ((cpus > $(nproc --all))); then  # more CPUs than the host has: slurmd takes the config's word, binds nothing
    bind=task/none overrides="SlurmdParameters=config_overrides"
  fi
  mem=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))  # MiB, a tenth left to the OS
  # MinJobAge=4: a finished job's record goes after 4 s, and sbatch --wait asks every 2 s (it waits 4x
  # longer each time, up to 32 s, only while that is under MinJobAge/2).
  cat >"$dir/slurm.conf" <<EOF
# One-node SLURM written by scripts/slurm_local.sh; everything lives in $dir.
ClusterName=dlas-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=$bind
$overrides
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
FirstJobId=$((1000 + RANDOM % 50000))
MinJobAge=4
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  echo "$host" >"$dir/node"
}

start() {
  install_missing
  if pid_of slurmctld >/dev/null; then
    say "already running in $dir"
    echo "export SLURM_CONF=$dir/slurm.conf"
    return
  fi
  mkdir -p "$dir"/{state,spool,log}
  chmod 711 "$dir"  # munged wants its socket's folder searchable by all; the state in it stays private
  chmod 700 "$dir"/{state,spool,log}
  export SLURM_CONF=$dir/slurm.conf
  write_config
  dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge.key"
  # --force: munged accepts a socket under folders closed to others (a test's private temporary folder)
  munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munged.seed" \
    || die "munged did not start: $(tail -n 3 "$dir/log/munged.log" 2>/dev/null)"
  slurmctld -f "$SLURM_CONF" -i || die "slurmctld did not start: $(tail -n 3 "$dir/log/slurmctld.log" 2>/dev/null)"
  slurmd -f "$SLURM_CONF" -N "$(<"$dir/node")" || die "slurmd did not start: $(tail -n 3 "$dir/log/slurmd.log" 2>/dev/null)"
  local state=""
  for _ in $(seq 120); do
    state=$(sinfo -h -N -o %t 2>/dev/null || true)
    [[ $state == idle ]] && break
    sleep 0.5
  done
  if [[ $state != idle ]]; then
    local why
    why=$(tail -n 5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" 2>/dev/null)
    stop >/dev/null 2>&1 || true
    die "the node is not idle after 60 s (sinfo: ${state:-no answer}); the logs end with: $why"
  fi
  say "node $(<"$dir/node") idle, $(sinfo -h -N -o %c) CPUs, logs in $dir/log"
  echo "export SLURM_CONF=$dir/slurm.conf"
}

stop() {
  export SLURM_CONF=$dir/slurm.conf
  if pid_of slurmctld >/dev/null; then
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    for _ in $(seq 20); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.5; done
  fi
  # all three at once: each takes about 2 s to shut down, and none needs another to do so
  local d pid
  local -A pids=()
  for d in slurmd slurmctld munged; do
    pid=$(pid_of $d) || continue
    kill "$pid" && pids[$d]=$pid
  done
  for d in "${!pids[@]}"; do
    pid=${pids[$d]}
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    say "stopped $d ($pid)"
  done
  return 0
}

status() {
  local any=0 pid
  for d in munged slurmctld slurmd; do
    if pid=$(pid_of $d); then echo "$d: running, pid $pid"; any=1; else echo "$d: not running"; fi
  done
  [[ $any -eq 1 ]] && SLURM_CONF=$dir/slurm.conf sinfo -N
  [[ $any -eq 1 ]]
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
