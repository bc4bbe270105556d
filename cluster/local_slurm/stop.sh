#!/bin/bash
# Tear down what cluster/local_slurm/setup.sh started under ROOT (default /tmp/zm-slurm).
#
# Usage (as root):  bash cluster/local_slurm/stop.sh [ROOT] [--purge]
#   --purge  also delete ROOT (config, logs, spool, accounting database).
#
# Each daemon is ended by the pid in its pid file under ROOT, then waited for (up to 5 s, then
# SIGKILL), so a following setup.sh finds the ports free. munged is ended only if setup.sh
# started it (it records that in ROOT/run/munged.pid). Idempotent: missing pid files and
# processes that are already gone are skipped. Packages stay installed.
set -uo pipefail

ROOT=/tmp/zm-slurm
PURGE=0
for arg in "$@"; do
  case "$arg" in
    --purge) PURGE=1 ;;
    -*) echo "usage: $0 [ROOT] [--purge]" >&2; exit 2 ;;
    *) ROOT=$arg ;;
  esac
done
[ -d "$ROOT" ] || { echo "[local-slurm] nothing to stop: $ROOT does not exist" >&2; exit 0; }

# Ends every daemon named by "name=pid-file" at once, then waits for all of them.
stop_wave() {
  local t0 item name file pid pids=() names=()
  t0=$(date +%s%N)
  for item in "$@"; do
    name=${item%%=*}; file=${item#*=}
    pid=$(cat "$file" 2>/dev/null) || continue
    rm -f "$file"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid"; pids+=("$pid"); names+=("$name"); fi
  done
  [ ${#pids[@]} = 0 ] && return 0
  for _ in $(seq 50); do
    local left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ $left = 0 ] && break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      kill -9 "${pids[$i]}"; echo "[local-slurm] ${names[$i]} (${pids[$i]}) needed SIGKILL" >&2
    fi
  done
  echo "[local-slurm] stopped ${names[*]} in $(( ($(date +%s%N) - t0) / 1000000 )) ms" >&2
}

# Slurm daemons first (slurmctld may still flush job records to slurmdbd while it exits),
# then the accounting daemon, its database and authentication.
slurmds=()
for file in "$ROOT"/run/slurmd.pid "$ROOT"/run/slurmd-*.pid; do  # (slurmd.pid: an older layout's)
  [ -e "$file" ] && slurmds+=("$(basename "$file" .pid)=$file")
done
stop_wave "${slurmds[@]}" "slurmctld=$ROOT/run/slurmctld.pid"
stop_wave "slurmdbd=$ROOT/run/slurmdbd.pid" "mariadbd=$ROOT/mysqlrun/mariadb.pid" "munged=$ROOT/run/munged.pid"
if [ $PURGE = 1 ]; then rm -rf "$ROOT"; echo "[local-slurm] removed $ROOT" >&2; fi
exit 0
