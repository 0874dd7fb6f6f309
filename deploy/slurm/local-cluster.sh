#!/bin/bash
# A one-node SLURM cluster on this machine, for running deploy/slurm.sbatch as a real cluster
# runs it (sbatch, srun, scancel, scontrol requeue), e.g. on a laptop or in CI.
#
#   deploy/slurm/local-cluster.sh up       # install (Debian/Ubuntu, root), configure, start
#   deploy/slurm/local-cluster.sh status   # daemons and `sinfo`
#   deploy/slurm/local-cluster.sh down     # stop the daemons it started
#
# `up` installs slurm-wlm and munge with apt-get where slurmctld is missing (root only), writes
# a slurm.conf for one node named after this host (`hostname -s`, address 127.0.0.1) with its
# real CPU count and memory ($COLOSSAL_SLURM_GPUS, default 8, stand-in GPUs), one partition `local`, no accounting, proctrack/linuxproc and
# task/none (no cgroups: it runs inside unprivileged containers), starts munged (unless one is
# running), slurmctld and slurmd, and waits until `sinfo` shows the node idle. Every step is
# one line; a daemon that does not come up ends it with status 1 and its log's last lines.
# `up` on a running cluster and `down` on a stopped one do nothing. `down` stops only the
# daemons this script started (their pid files are in the state directory).
#
# State (config, spool, logs, pid files) lives in $COLOSSAL_SLURM_DIR (default
# /tmp/colossal-slurm). The clients find the config through /etc/slurm/slurm.conf, which `up`
# makes a link to it when there is no other slurm.conf there; otherwise export
# SLURM_CONF=$COLOSSAL_SLURM_DIR/slurm.conf (`status` prints the line).
set -euo pipefail

DIR=${COLOSSAL_SLURM_DIR:-/tmp/colossal-slurm}
CONF=$DIR/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)
MUNGE_SOCKET=/run/munge/munge.socket.2
GPUS=${COLOSSAL_SLURM_GPUS:-8}
CHANGED=
export SLURM_CONF=$CONF

say() { echo "local-cluster: $*"; }
fail() {
  echo "local-cluster: error: $1" >&2
  if [[ -n ${2:-} && -f $2 ]]; then
    echo "--- last lines of $2:" >&2
    tail -n 15 "$2" >&2
  fi
  exit 1
}

# the pid in pid file $1 when that process is alive, else nothing
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null && cat "$1"; }

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
    && command -v munged >/dev/null && command -v sbatch >/dev/null; then
    say "packages: slurmctld, slurmd, munged and sbatch are installed"
    return
  fi
  [[ $(id -u) == 0 ]] || fail "slurm-wlm/munge are not installed and installing needs root: \
run sudo apt-get install -y slurm-wlm munge, then $0 up"
  command -v apt-get >/dev/null || fail "slurm-wlm/munge are not installed and there is no \
apt-get: install SLURM (slurmctld, slurmd, sbatch) and munge with this system's package manager"
  say "packages: apt-get install slurm-wlm munge (a minute or two)"
  apt-get update -qq >"$DIR/apt.log" 2>&1 || fail "apt-get update failed" "$DIR/apt.log"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >>"$DIR/apt.log" 2>&1 \
    || fail "apt-get install slurm-wlm munge failed" "$DIR/apt.log"
}

write_conf() {
  local cpus mem
  cpus=$(nproc --all)
  mem=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
  mkdir -p "$DIR/ctld" "$DIR/d"
  cat >"$CONF.new" <<CONF
# written by deploy/slurm/local-cluster.sh: one node ($NODE) on 127.0.0.1
ClusterName=colossal-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits for its step credentials to expire before it starts again (default
# 120 s): 10 s here, so that a requeue resumes at once
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# no cgroups (unprivileged containers): processes tracked by parentage, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# seconds between the SIGTERM and the SIGKILL of scancel and of the time limit: the time a
# run has to write its checkpoint
KillWait=60
# a batch job may be requeued (scontrol requeue, or the recipe itself after a SIGTERM)
JobRequeue=1
SlurmdTimeout=60
# RPCs between the daemons: a busy machine answers late, and a timed-out signal to a step is
# retried later by slurmctld, where it may hit the requeued job's step of the same id
MessageTimeout=60
# stand-in GPUs (gres.conf: links to /dev/null) so that a recipe asking for --gpus-per-task or
# --gres=gpu:N is scheduled; its tasks run on CPU devices (COLOSSAL_CPU_DEVICES)
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:$GPUS State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
  # gres/gpu wants device files: links to /dev/null (a character device) stand in for them
  mkdir -p "$DIR/gpus"
  for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/gpus/gpu$i"; done
  echo "Name=gpu File=$DIR/gpus/gpu[0-$((GPUS - 1))]" >"$DIR/gres.conf"
  if [[ -f $CONF ]] && cmp -s "$CONF" "$CONF.new"; then
    rm "$CONF.new"
    say "config: $CONF unchanged ($NODE, $cpus CPUs, $mem MB, $GPUS stand-in GPUs)"
  else
    mv "$CONF.new" "$CONF"
    CHANGED=1
    say "config: wrote $CONF ($NODE, $cpus CPUs, $mem MB, $GPUS stand-in GPUs)"
  fi
  if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
    :
  elif [[ ! -e $ETC_CONF && -w $(dirname "$ETC_CONF") ]]; then
    ln -s "$CONF" "$ETC_CONF"
    say "config: $ETC_CONF -> $CONF"
  else
    say "config: $ETC_CONF is not ours; clients need: export SLURM_CONF=$CONF"
  fi
}

start_munge() {
  if munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
    say "munge: running"
    return
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  [[ -f /etc/munge/munge.key ]] || fail "no /etc/munge/munge.key: run mungekey -c as root"
  local pidfile=/run/munge/munged.pid
  if [[ $(id -u) == 0 ]]; then
    runuser -u munge -- munged --pid-file="$pidfile" || fail "munged did not start" \
      /var/log/munge/munged.log
  else
    munged --pid-file="$pidfile" || fail "munged did not start" /var/log/munge/munged.log
  fi
  for _ in $(seq 50); do
    if munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
      cp "$pidfile" "$DIR/munged.pid"  # ours: `down` stops it
      say "munge: started (pid $(cat "$pidfile"))"
      return
    fi
    sleep 0.1
  done
  fail "munged does not answer on $MUNGE_SOCKET" /var/log/munge/munged.log
}

# start daemon $1 (slurmctld or slurmd) unless its pid file names a live process
start_daemon() {
  local name=$1 pid
  if pid=$(alive "$DIR/$name.pid"); then
    say "$name: running (pid $pid)"
    return
  fi
  : >"$DIR/$name.log.start"
  "$name" -f "$CONF" >"$DIR/$name.log.start" 2>&1 || fail "$name exited with status $?" \
    "$DIR/$name.log"
  for _ in $(seq 100); do
    if pid=$(alive "$DIR/$name.pid"); then
      say "$name: started (pid $pid, log $DIR/$name.log)"
      return
    fi
    sleep 0.1
  done
  fail "$name did not come up within 10 s" "$DIR/$name.log"
}

wait_idle() {
  local state=""
  for _ in $(seq 60); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    if [[ $state == idle* ]]; then
      say "sinfo: node $NODE is idle; partition local is up"
      return
    fi
    if [[ $state == down* || $state == drain* ]]; then
      scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
    fi
    sleep 1
  done
  fail "node $NODE is not idle after 60 s (sinfo says: ${state:-nothing})" "$DIR/slurmd.log"
}

up() {
  mkdir -p "$DIR"
  install_packages
  write_conf
  if [[ -n $CHANGED ]] && alive "$DIR/slurmctld.pid" >/dev/null; then
    say "config: changed under running daemons; restarting them"
    stop "$DIR/slurmd.pid" slurmd
    stop "$DIR/slurmctld.pid" slurmctld
  fi
  start_munge
  start_daemon slurmctld
  start_daemon slurmd
  wait_idle
}

# stop the process of pid file $1 (named $2): SIGTERM, then SIGKILL after 10 s
stop() {
  local pid
  if ! pid=$(alive "$1"); then
    say "$2: not running"
    rm -f "$1"
    return
  fi
  kill "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || { say "$2: stopped (pid $pid)"; rm -f "$1"; return; }
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$1"
  say "$2: killed (pid $pid did not stop within 10 s)"
}

down() {
  if [[ -f $CONF ]] && command -v scancel >/dev/null && alive "$DIR/slurmctld.pid" >/dev/null
  then
    scancel --full --signal=KILL --partition=local >/dev/null 2>&1 || true
  fi
  stop "$DIR/slurmd.pid" slurmd
  stop "$DIR/slurmctld.pid" slurmctld
  stop "$DIR/munged.pid" munged
  if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
    rm "$ETC_CONF"
    say "config: removed the link $ETC_CONF"
  fi
}

status() {
  local pid
  for name in munged slurmctld slurmd; do
    if pid=$(alive "$DIR/$name.pid"); then say "$name: running (pid $pid)"
    else say "$name: not running (from here)"; fi
  done
  if alive "$DIR/slurmctld.pid" >/dev/null; then
    say "sinfo: $(sinfo -h -o '%P %a %D %T' 2>&1 | tr '\n' ' ')"
  fi
  say "clients: export SLURM_CONF=$CONF"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
