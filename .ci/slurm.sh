#!/usr/bin/env bash
# A one-node SLURM cluster for the tests (tests/e2e/test_slurm.py), on this machine, as root:
#   .ci/slurm.sh start   install slurm-wlm and munge if missing (Debian), start munged, slurmctld
#                        and slurmd; return once a one-task job has run. Idempotent.
#   .ci/slurm.sh stop    cancel every job, stop the three daemons through their PID files.
# The node is this machine as `slurmd -C` sees it (CPU only), partition `debug`. Without
# accounting (no slurmdbd): tests/helpers/no_accounting/sacct answers submitit's `sacct` query from the controller's
# job records; the tests put it on PATH (docs/sweeps.md, "A cluster without accounting").
set -euo pipefail
CONF=/etc/slurm/slurm.conf
SPOOL=/var/spool/emergence-slurm
LOGS=/var/log/emergence-slurm
PIDS=/run/emergence-slurm
DAEMONS=(slurmd slurmctld munged)  # stop order

running() {  # running NAME: its PID file names a live process of that name
  local pf=$PIDS/$1.pid
  [ -s "$pf" ] && [ "$(cat "/proc/$(cat "$pf")/comm" 2>/dev/null)" = "$1" ]
}

ready() {  # the node is idle and takes a job: munge, controller and node daemon all work
  [ "$(sinfo -h -N -o %T 2>/dev/null)" = idle ] && timeout 30 srun -N1 -n1 -t 1 true 2>/dev/null
}

start() {
  [ "$(id -u)" = 0 ] || { echo "slurm.sh: needs root (installs packages, starts daemons)" >&2; exit 1; }
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    # Debian's policy-rc.d (containers, no systemd) keeps the packages from starting daemons: started below
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  fi
  install -d -m 0755 "$PIDS" "$SPOOL/ctld" "$SPOOL/d" "$LOGS"
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge  # systemd's RuntimeDirectory where there is one
  if ! running munged; then
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    cp /run/munge/munged.pid "$PIDS/munged.pid"
  fi
  local host node
  host=$(hostname -s)
  node=$(slurmd -C | head -1 | sed "s/^NodeName=[^ ]*/NodeName=$host NodeAddr=127.0.0.1/")
  mkdir -p "$(dirname "$CONF")"
  cat > "$CONF" <<CONFEOF
# Written by .ci/slurm.sh: one node (this machine), partition debug, no accounting daemon.
ClusterName=emergence-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=$PIDS/slurmctld.pid
SlurmdPidFile=$PIDS/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=5
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
$node State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONFEOF
  running slurmctld || /usr/sbin/slurmctld
  running slurmd || /usr/sbin/slurmd
  for _ in $(seq 60); do
    if ready; then
      for _ in $(seq 20); do  # a node is "completing" for a moment after each job
        [ "$(sinfo -h -N -o %T)" = idle ] && { sinfo; return 0; }
        sleep 0.5
      done
    fi
    sleep 1
  done
  echo "slurm.sh: the node is not ready after 60 s" >&2
  sinfo -N -l >&2 || true
  tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
  exit 1
}

stop() {
  if running slurmctld; then
    local ids
    ids=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$ids" ]; then
      scancel $ids || true
      for _ in $(seq 30); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 1; done
    fi
  fi
  local name pf pid
  for name in "${DAEMONS[@]}"; do
    pf=$PIDS/$name.pid
    if running "$name"; then
      pid=$(cat "$pf")
      kill -TERM "$pid"
      for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "slurm.sh: $name ($pid) did not stop, killing it" >&2
        kill -KILL "$pid"
      fi
    fi
    rm -f "$pf"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
