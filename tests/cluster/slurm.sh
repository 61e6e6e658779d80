#!/usr/bin/env bash
# A real single-node SLURM cluster for tests: munged + slurmctld + slurmd on this machine.
#   tests/cluster/slurm.sh install   # Debian packages (root): slurmctld slurmd slurm-client munge
#   tests/cluster/slurm.sh up        # start (idempotent); prints `export SLURM_CONF=...`
#   tests/cluster/slurm.sh down      # stop every daemon it started (by PID file)
#   tests/cluster/slurm.sh status
# State (config, keys, spool, logs, PID files) lives in $FMB_SLURM_STATE (default /tmp/fmb-slurm).
# Facts for containers without systemd/cgroups: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none;
# DefMemPerCPU so jobs without a memory request do not take the whole node; no accounting (the
# Snakemake plugin is then run with --slurm-status-command squeue and MinJobAge is kept long).
# The Snakemake SLURM plugin deletes every SLURM_* variable inside jobs (SLURM_CONF too), so srun in a
# job only finds the default /etc/slurm/slurm.conf: `up` links it to this cluster's config when that
# path is free (or already ours) and `down` removes the link.
set -euo pipefail

STATE=${FMB_SLURM_STATE:-/tmp/fmb-slurm}
CONF=$STATE/slurm.conf
PORT_CTLD=${FMB_SLURM_PORT:-16817}
PORT_D=$((PORT_CTLD + 1))

need_root() { [ "$(id -u)" = 0 ] || { echo "slurm.sh: must run as root" >&2; exit 2; }; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_pkgs() {
  need_root
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
     && command -v munged >/dev/null; then return 0; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

write_conf() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) * 8 / 10 ))
  mkdir -p "$STATE"/{ctld,spool,log}
  cat > "$CONF" <<EOF
ClusterName=fmbtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT_CTLD
SlurmdPort=$PORT_D
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge.socket
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
MinJobAge=600
ReturnToService=2
SchedulerType=sched/backfill
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

up() {
  need_root
  install_pkgs
  mkdir -p "$STATE"
  [ -f "$CONF" ] || write_conf
  if ! pid_alive "$STATE/munged.pid"; then
    [ -f "$STATE/munge.key" ] || { dd if=/dev/urandom of="$STATE/munge.key" bs=1024 count=1 status=none; chmod 400 "$STATE/munge.key"; }
    munged --force --key-file="$STATE/munge.key" --socket="$STATE/munge.socket" \
      --pid-file="$STATE/munged.pid" --log-file="$STATE/log/munged.log" --seed-file="$STATE/munged.seed"
  fi
  export SLURM_CONF=$CONF
  link_default_conf
  pid_alive "$STATE/slurmctld.pid" || slurmctld -f "$CONF"
  pid_alive "$STATE/slurmd.pid" || slurmd -f "$CONF"
  for _ in $(seq 1 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "export SLURM_CONF=$CONF"
      return 0
    fi
    scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm.sh: the node did not become idle; see $STATE/log" >&2
  sinfo >&2 || true
  down  # leave nothing running after a failed start
  exit 1
}

DEFAULT_CONF=/etc/slurm/slurm.conf

link_default_conf() {
  mkdir -p "$(dirname "$DEFAULT_CONF")"
  if [ -L "$DEFAULT_CONF" ] || [ ! -e "$DEFAULT_CONF" ]; then
    ln -sfn "$CONF" "$DEFAULT_CONF"
  elif [ "$(readlink -f "$DEFAULT_CONF")" != "$(readlink -f "$CONF")" ]; then
    echo "slurm.sh: $DEFAULT_CONF exists and is not ours; jobs' srun will read it" >&2
  fi
}

down() {
  for d in slurmd slurmctld munged; do
    if pid_alive "$STATE/$d.pid"; then
      kill "$(cat "$STATE/$d.pid")" 2>/dev/null || true
      for _ in $(seq 1 20); do pid_alive "$STATE/$d.pid" || break; sleep 0.25; done
      pid_alive "$STATE/$d.pid" && kill -9 "$(cat "$STATE/$d.pid")" 2>/dev/null || true
    fi
    rm -f "$STATE/$d.pid"
  done
  if [ -L "$DEFAULT_CONF" ] && [ "$(readlink "$DEFAULT_CONF")" = "$CONF" ]; then rm -f "$DEFAULT_CONF"; fi
}

status() {
  for d in munged slurmctld slurmd; do
    if pid_alive "$STATE/$d.pid"; then echo "$d running ($(cat "$STATE/$d.pid"))"; else echo "$d stopped"; fi
  done
  SLURM_CONF=$CONF sinfo 2>/dev/null || true
}

case "${1:-}" in
  install) install_pkgs ;;
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 install|up|down|status" >&2; exit 2 ;;
esac
