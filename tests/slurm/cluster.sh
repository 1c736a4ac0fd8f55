#!/usr/bin/env bash
# A throw-away SLURM cluster on this host for the tests: slurmctld plus two slurmd (-N n1, -N n2)
# on loopback, root-owned, state under $NORMLAB_TEST_CLUSTER_DIR (default /tmp/normlab-slurm).
#   tests/slurm/cluster.sh start   install (Debian, no recommends) if needed, configure, start
#   tests/slurm/cluster.sh stop    stop the daemons this script started
#   tests/slurm/cluster.sh status  sinfo
# It refuses to touch an /etc/slurm/slurm.conf it did not write (a real cluster's).
set -euo pipefail
STATE=${NORMLAB_TEST_CLUSTER_DIR:-/tmp/normlab-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by normlab tests/slurm/cluster.sh"
NODES=(n1 n2)

die() { echo "cluster.sh: $*" >&2; exit 1; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
     && command -v munged >/dev/null; then return; fi
  [ "$(id -u)" = 0 ] || die "SLURM is not installed and installing it needs root"
  command -v apt-get >/dev/null || die "SLURM is not installed and there is no apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends \
         slurmctld slurmd slurm-client munge >/dev/null; } || die "apt-get install failed"
}

write_conf() {
  if [ -f "$CONF" ] && ! head -1 "$CONF" | grep -qF "$MARK"; then
    die "$CONF exists and was not written by this script (a real cluster?); not touching it"
  fi
  local cpus host
  cpus=$(( $(nproc) ))
  host=$(hostname -s)
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/log"
  cat > "$CONF" <<CONF
$MARK
ClusterName=normlab-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
AuthType=auth/munge
# cred_expire=5: a requeued job may start again after 5 s instead of ~145 s
AuthInfo=cred_expire=5
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# short scheduler intervals: pending and requeued jobs start within about a second
SchedulerParameters=sched_interval=1,sched_min_interval=100000,bf_interval=1,batch_sched_delay=1
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=16818 CPUs=$cpus RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=16819 CPUs=$cpus RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}

start_munge() {
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return
  [ -s /etc/munge/munge.key ] || { mungekey -c -f >/dev/null 2>&1 || die "cannot create munge key"; }
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown -R munge: /run/munge /var/log/munge /var/lib/munge /etc/munge
  runuser -u munge -- munged || die "munged failed to start"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
  die "munged does not answer"
}

start() {
  install
  write_conf
  start_munge
  stop_daemons quiet
  slurmctld -c -i || die "slurmctld failed to start (see $STATE/log/slurmctld.log)"
  for n in "${NODES[@]}"; do
    mkdir -p "$STATE/slurmd-$n"
    slurmd -N "$n" || die "slurmd -N $n failed to start (see $STATE/log/slurmd-$n.log)"
  done
  for _ in $(seq 150); do
    if [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -cE '^(idle|mix|alloc)')" = "${#NODES[@]}" ]; then
      sinfo -N; return
    fi
    sleep 0.2
  done
  sinfo -N >&2 || true
  die "nodes did not come up within 30 s (see $STATE/log/)"
}

stop_daemons() {
  local f pid
  for f in "$STATE"/slurmd-*.pid "$STATE"/slurmctld.pid; do
    pid=$(cat "$f" 2>/dev/null) || continue  # a daemon removes its pid file as it exits
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$f"
  done
  [ "${1:-}" = quiet ] || echo "cluster.sh: stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop_daemons ;;
  status) sinfo -N ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
