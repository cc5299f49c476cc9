#!/usr/bin/env bash
# A real single-node Slurm cluster on this host, for the `--executor slurm` tests
# (app/desktop/tests/slurm.rs) and for trying the executor by hand (docs/slurm.md).
#
#   scripts/slurm-cluster.sh start    install Debian's slurm-wlm + munge if missing (apt-get,
#                                     root), write slurm.conf for `hostname` with the CPUs and
#                                     memory `slurmd -C` measures, start munged, slurmctld and
#                                     slurmd, wait until `sinfo` shows the node idle. Does
#                                     nothing but the wait when the cluster already runs.
#   scripts/slurm-cluster.sh stop     stops the daemons this script started.
#   scripts/slurm-cluster.sh status   `sinfo` of the cluster (exit 1 if it is down).
#
# Everything lives in ${MERGESCOPE_SLURM_DIR:-/tmp/mergescope-slurm}: slurm.conf, the state and
# spool folders, the daemons' logs and pid files. Clients find the cluster through
#   export SLURM_CONF=${MERGESCOPE_SLURM_DIR:-/tmp/mergescope-slurm}/slurm.conf
# which `start` prints as its last line. The packaged Slurm (22.05 on Debian 12) authenticates
# with munge (auth/slurm only came with 23.11), so munge's key from the package is used.
# Slurm's accounting daemon is not set up: `sacct` has no records here and the executor reads
# job states from `squeue --states=all` (kept MinJobAge seconds after a job ends).
set -euo pipefail

dir="${MERGESCOPE_SLURM_DIR:-/tmp/mergescope-slurm}"
conf="$dir/slurm.conf"
cmd="${1:-start}"

log() { echo "slurm-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_idle() {
  SLURM_CONF="$conf" sinfo -h -N -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'
}

install_slurm() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null; then
    return
  fi
  [ "$(id -u)" = 0 ] || die "Slurm is not installed and installing it needs root (apt-get install slurm-wlm munge)"
  command -v apt-get >/dev/null || die "Slurm is not installed and there is no apt-get to install it (install slurm-wlm and munge)"
  log "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Daemons are started below, not by the packages' service scripts.
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d.mergescope
  chmod +x /usr/sbin/policy-rc.d.mergescope
  local had_policy=0
  [ -e /usr/sbin/policy-rc.d ] && had_policy=1
  [ "$had_policy" = 1 ] || cp /usr/sbin/policy-rc.d.mergescope /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null \
    || { [ "$had_policy" = 1 ] || rm -f /usr/sbin/policy-rc.d; die "apt-get install slurm-wlm munge failed"; }
  [ "$had_policy" = 1 ] || rm -f /usr/sbin/policy-rc.d
  rm -f /usr/sbin/policy-rc.d.mergescope
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    return
  fi
  [ -f /etc/munge/munge.key ] || {
    log "creating /etc/munge/munge.key"
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key; else
      dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
  }
  local user=root
  id munge >/dev/null 2>&1 && user=munge
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown "$user" /run/munge /var/lib/munge /var/log/munge /etc/munge/munge.key
  chmod 0755 /run/munge
  chmod 0400 /etc/munge/munge.key
  if [ "$user" = munge ]; then
    runuser -u munge -- munged 9>&-
  else
    munged --force 9>&-
  fi
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return
    sleep 0.1
  done
  die "munged did not start (see /var/log/munge/munged.log)"
}

write_conf() {
  local host node
  host="$(hostname -s)"
  # The node exactly as slurmd measures it: CPUs, sockets, cores, threads, RealMemory.
  node="$(slurmd -C | head -n 1)"
  case "$node" in NodeName=*) ;; *) die "slurmd -C gave no node line: $node" ;; esac
  mkdir -p "$dir/state" "$dir/spool"
  cat >"$conf.tmp" <<EOF
# Written by scripts/slurm-cluster.sh: a single-node test cluster on $host.
ClusterName=mergescope
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=${MERGESCOPE_SLURMCTLD_PORT:-6817}
SlurmdPort=${MERGESCOPE_SLURMD_PORT:-6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
# CPUs only: a job asks for no memory share, so cells run side by side on every CPU.
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
MaxArraySize=100001
# Start pending array tasks as soon as CPUs free up (the test cluster is small).
SchedulerParameters=sched_interval=2,batch_sched_delay=1,default_queue_depth=1000
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$conf.tmp" "$conf"
}

start() {
  install_slurm
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if running "$dir/slurmctld.pid" && running "$dir/slurmd.pid" && node_idle; then
    echo "export SLURM_CONF=$conf"
    return
  fi
  [ "$(id -u)" = 0 ] || die "starting slurmd needs root"
  local t0
  t0=$(date +%s.%N)
  start_munge
  running "$dir/slurmctld.pid" && running "$dir/slurmd.pid" || {
    stop_daemons
    write_conf
    # The daemons must not inherit the lock (fd 9).
    SLURM_CONF="$conf" slurmctld -f "$conf" -i 9>&- || die "slurmctld did not start (see $dir/slurmctld.log)"
    SLURM_CONF="$conf" slurmd -f "$conf" 9>&- || die "slurmd did not start (see $dir/slurmd.log)"
  }
  for _ in $(seq 300); do
    if node_idle; then
      log "cluster up in $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN { printf \"%.1f\", b - a }") s: $(SLURM_CONF="$conf" sinfo -h -N -o '%N %c CPUs %m MB %T')"
      echo "export SLURM_CONF=$conf"
      return
    fi
    # A node left down or drained by an earlier run comes back.
    SLURM_CONF="$conf" scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
    sleep 0.2
  done
  die "the node did not become idle in 60 s: $(SLURM_CONF="$conf" sinfo -N 2>&1); see $dir/slurmctld.log and $dir/slurmd.log"
}

stop_daemons() {
  for d in slurmd slurmctld; do
    if running "$dir/$d.pid"; then
      local pid
      pid="$(cat "$dir/$d.pid")"
      kill "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$dir/$d.pid"
  done
}

case "$cmd" in
  start) start ;;
  stop) stop_daemons; log "stopped (state kept in $dir)" ;;
  status) SLURM_CONF="$conf" sinfo || exit 1 ;;
  *) die "usage: $0 start|stop|status" ;;
esac
