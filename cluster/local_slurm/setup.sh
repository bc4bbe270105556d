#!/bin/bash
# Bring up a single-node Slurm (Debian 12: Slurm 22.05 + munge) on this machine, for the
# `@pytest.mark.slurm` tests and for trying `--cluster slurm` launches without a real cluster.
#
# Usage (as root):  eval "$(bash cluster/local_slurm/setup.sh ROOT [--no-dbd])"
#   ROOT      directory for config, pid files, logs, spool and the accounting database
#             (default: /tmp/zm-slurm). Everything this script creates, except packages and
#             /run/munge, lives under ROOT.
#   --no-dbd  skip MariaDB + slurmdbd. Jobs still run, but `sacct` is disabled, so submitit
#             reports state UNKNOWN while polling (results still arrive through its pickles).
#
# stdout carries exactly one line, `export SLURM_CONF=ROOT/slurm.conf`; progress goes to stderr.
# Idempotent: packages already present are not reinstalled, daemons already running from this
# ROOT are kept (restarted only when the generated slurm.conf changed), an existing database is
# reused. Nothing here starts system services; every daemon is started by hand and recorded in a
# pid file that stop.sh uses. Environment overrides: ZM_SLURM_CPUS, ZM_SLURM_MEM_MB,
# ZM_SLURM_DB_PORT (default 3306).
set -euo pipefail

usage() { echo "usage: $0 [ROOT] [--no-dbd]" >&2; exit 2; }
ROOT=/tmp/zm-slurm
WITH_DBD=1
for arg in "$@"; do
  case "$arg" in
    --no-dbd) WITH_DBD=0 ;;
    -h|--help) usage ;;
    -*) echo "unknown option: $arg" >&2; usage ;;
    *) ROOT=$arg ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "setup.sh must run as root (it installs packages and starts daemons)" >&2; exit 1; }
mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd)
say() { echo "[local-slurm] $*" >&2; }
die() { echo "[local-slurm] ERROR: $*" >&2; exit 1; }
T0=$(date +%s%N)
elapsed() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }

# A pid file counts only if its process is alive.
alive() { local pid; pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }
wait_gone() {  # pid-file: wait up to 10 s for the recorded process to exit
  local pid; pid=$(cat "$1" 2>/dev/null) || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  rm -f "$1"
}

# ---- packages -------------------------------------------------------------------------------
PKGS=""
command -v slurmctld >/dev/null && command -v slurmd >/dev/null || PKGS="slurm-wlm"
command -v munged >/dev/null || PKGS="$PKGS munge"
if [ $WITH_DBD = 1 ]; then
  command -v slurmdbd >/dev/null || PKGS="$PKGS slurmdbd"
  command -v mariadbd >/dev/null || PKGS="$PKGS mariadb-server"
fi
if [ -n "${PKGS// /}" ]; then
  say "installing:$PKGS"
  # Debian postinst scripts try to start services; policy-rc.d 101 forbids that while installing.
  POLICY=/usr/sbin/policy-rc.d; HAD_POLICY=0; [ -e $POLICY ] && HAD_POLICY=1
  [ $HAD_POLICY = 1 ] || { printf '#!/bin/sh\nexit 101\n' > $POLICY; chmod +x $POLICY; }
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS >>"$ROOT/apt.log" 2>&1; }
  # A fresh machine has no package lists yet: update once, only when the first install fails.
  apt_install || { say "install failed; running apt-get update and retrying"; apt-get update -q >>"$ROOT/apt.log" 2>&1; apt_install; } \
    || { [ $HAD_POLICY = 1 ] || rm -f $POLICY; tail -20 "$ROOT/apt.log" >&2; die "apt-get install failed"; }
  [ $HAD_POLICY = 1 ] || rm -f $POLICY
  say "packages installed ($(elapsed) s)"
fi
# the node that takes every default job, and two "twin" nodes (a second and third slurmd on this
# machine, each on its own port: Debian's build runs several) for two-node jobs (partition twin)
NODES="local twin1 twin2"
mkdir -p "$ROOT"/{run,log,spool/slurmctld}
for node in $NODES; do mkdir -p "$ROOT/spool/slurmd-$node"; done

# ---- munge ----------------------------------------------------------------------------------
# munged refuses to run as root ("Logfile is insecure"), so it runs as user munge. If some munged
# already answers on the default socket (ours from an earlier run, or the system's), reuse it.
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "munged already answering"
else
  if [ ! -s /etc/munge/munge.key ]; then
    /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
      || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged does not answer (see /var/log/munge/munged.log)"
  # Recorded under ROOT so stop.sh only ends a munged that this script started.
  cp /run/munge/munged.pid "$ROOT/run/munged.pid"
  say "munged started"
fi

# ---- accounting: MariaDB + slurmdbd ---------------------------------------------------------
DB_PORT=${ZM_SLURM_DB_PORT:-3306}
ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
if [ $WITH_DBD = 1 ]; then
  mkdir -p "$ROOT/db" "$ROOT/mysqlrun"
  chown mysql:mysql "$ROOT/db" "$ROOT/mysqlrun"
  # MariaDB runs as user mysql, which must be able to reach ROOT (mktemp -d makes it 0700).
  chmod a+rx "$ROOT"
  runuser -u mysql -- test -x "$ROOT/db" \
    || die "user mysql cannot reach $ROOT (a parent directory is closed); choose a ROOT under /tmp"
  SOCK=$ROOT/mysqlrun/mysql.sock
  if alive "$ROOT/mysqlrun/mariadb.pid"; then
    say "mariadbd already running"
  else
    if [ ! -d "$ROOT/db/mysql" ]; then
      mariadb-install-db --user=mysql --datadir="$ROOT/db" --auth-root-authentication-method=socket \
        >"$ROOT/log/mariadb-install.log" 2>&1 || { tail -20 "$ROOT/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    fi
    setsid /usr/sbin/mariadbd --user=mysql --datadir="$ROOT/db" --socket="$SOCK" \
      --pid-file="$ROOT/mysqlrun/mariadb.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
      --log-error="$ROOT/log/mariadb.err" </dev/null >/dev/null 2>&1 &
    for _ in $(seq 100); do mariadb -S "$SOCK" -u root -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.1; done
    mariadb -S "$SOCK" -u root -e 'SELECT 1' >/dev/null 2>&1 \
      || { tail -20 "$ROOT/log/mariadb.err" >&2; die "MariaDB did not start"; }
    say "mariadbd started"
  fi
  # The password only guards a database bound to 127.0.0.1 that holds job records of this machine.
  mariadb -S "$SOCK" -u root -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  cat > "$ROOT/slurmdbd.conf" <<EOC
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
PidFile=$ROOT/run/slurmdbd.pid
LogFile=$ROOT/log/slurmdbd.log
EOC
  chmod 600 "$ROOT/slurmdbd.conf"   # slurmdbd refuses a config readable by others
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux"
fi

# ---- slurm.conf -----------------------------------------------------------------------------
CPUS=${ZM_SLURM_CPUS:-$(nproc)}
# Leave 10% of memory to the OS; jobs asking for more than this are refused at submission.
MEM_MB=${ZM_SLURM_MEM_MB:-$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)}
# The twins share the same cores and memory (half each): a two-node job there gets the machine once.
TWIN_CPUS=$(( CPUS > 1 ? CPUS / 2 : 1 ))
TWIN_MEM_MB=$(( MEM_MB / 2 ))
NEW_CONF=$(cat <<EOC
# Generated by cluster/local_slurm/setup.sh; one machine (a default node and two twins), no cgroups.
ClusterName=zm
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$ACCT
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmdSpoolDir=$ROOT/spool/slurmd-%n
StateSaveLocation=$ROOT/spool/slurmctld
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
NodeName=local NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
NodeName=twin1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=6821 CPUs=$TWIN_CPUS RealMemory=$TWIN_MEM_MB State=UNKNOWN
NodeName=twin2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=6822 CPUs=$TWIN_CPUS RealMemory=$TWIN_MEM_MB State=UNKNOWN
PartitionName=debug Nodes=local Default=YES MaxTime=INFINITE State=UP
PartitionName=twin Nodes=twin1,twin2 MaxTime=INFINITE State=UP
EOC
)
CONF=$ROOT/slurm.conf
if [ -f "$CONF" ] && [ "$(cat "$CONF")" != "$NEW_CONF" ]; then
  say "slurm.conf changed: restarting slurmd and slurmctld"
  for p in slurmd slurmd-local slurmd-twin1 slurmd-twin2 slurmctld; do  # (slurmd: an older layout's)
    if alive "$ROOT/run/$p.pid"; then kill "$(cat "$ROOT/run/$p.pid")"; wait_gone "$ROOT/run/$p.pid"; fi
  done
fi
printf '%s\n' "$NEW_CONF" > "$CONF"
export SLURM_CONF=$CONF   # slurmdbd reads slurmdbd.conf from the same directory

# ---- daemons --------------------------------------------------------------------------------
if [ $WITH_DBD = 1 ]; then
  if alive "$ROOT/run/slurmdbd.pid"; then say "slurmdbd already running"; else slurmdbd; fi
  for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.1; done
  sacctmgr -n list cluster >/dev/null 2>&1 || { tail -20 "$ROOT/log/slurmdbd.log" >&2; die "slurmdbd does not answer"; }
  sacctmgr -n -P list cluster format=cluster | grep -qx zm || sacctmgr -i add cluster zm >/dev/null
fi
if alive "$ROOT/run/slurmctld.pid"; then say "slurmctld already running"; else slurmctld -f "$CONF"; fi
# -N: each slurmd is its node whatever the (unstable) hostname is.
for node in $NODES; do
  if alive "$ROOT/run/slurmd-$node.pid"; then say "slurmd $node already running"; else slurmd -f "$CONF" -N "$node"; fi
done
for node in $NODES; do
  STATE=""
  for _ in $(seq 150); do
    STATE=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
    case "$STATE" in idle|mixed|allocated) break ;; esac
    sleep 0.2
  done
  case "$STATE" in
    idle|mixed|allocated) ;;
    *) tail -10 "$ROOT/log/slurmctld.log" "$ROOT/log/slurmd-$node.log" >&2; die "node $node state '${STATE:-none}' after 30 s" ;;
  esac
done
# The node may look idle from saved state before slurmd has registered: prove the whole path works.
srun --quiet --nodes=1 --ntasks=1 --time=1 --job-name=zm-ready true 2>"$ROOT/log/ready.err" \
  && srun --quiet --partition=twin --nodes=2 --ntasks=2 --time=1 --job-name=zm-ready true 2>>"$ROOT/log/ready.err" \
  || { cat "$ROOT/log/ready.err" >&2; tail -10 "$ROOT/log/slurmctld.log" "$ROOT/log/"slurmd-*.log >&2; die "test job failed"; }
sinfo >&2
say "ready in $(elapsed) s (accounting: $([ $WITH_DBD = 1 ] && echo slurmdbd || echo none))"
echo "export SLURM_CONF=$CONF"
