#!/usr/bin/env bash
# Stop the daemons started by start-local-slurm.sh (slurmd, slurmctld, and munged
# if that script started it). Running jobs' processes are not killed.
# --keep-munge: leave munged running.
set -euo pipefail
STATE=/var/lib/slurm-local

# alive PID NAME: PID is a live (not zombie) process named NAME.
alive() { [[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]] && ! grep -q '^State:.*zombie' "/proc/$1/status" 2>/dev/null; }
# stop PIDFILE NAME: SIGTERM the daemon, wait up to 10 s, then SIGKILL.
stop() {
  local p; p=$(cat "$1" 2>/dev/null) || return 0
  if alive "$p" "$2"; then
    kill "$p"
    for _ in {1..20}; do alive "$p" "$2" || break; sleep 0.5; done
    alive "$p" "$2" && kill -9 "$p"
    echo "stop-local-slurm: stopped $2 ($p)"
  fi
  rm -f "$1"
}

stop "$STATE/run/slurmd.pid" slurmd
stop "$STATE/run/slurmctld.pid" slurmctld
if [[ ${1:-} != --keep-munge && -f $STATE/run/munged.started ]]; then
  stop /run/munge/munged.pid munged
  rm -f "$STATE/run/munged.started"
fi
