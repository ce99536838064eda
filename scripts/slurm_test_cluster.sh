#!/usr/bin/env bash
# =============================================================================
# slurm_test_cluster.sh - start/stop a REAL, local, multi-node Slurm test
# cluster for hpc_train's test suite and CI (Debian/Ubuntu, run as root).
# =============================================================================
#
# USAGE
#   scripts/slurm_test_cluster.sh install  # only install the Debian packages that are missing
#   scripts/slurm_test_cluster.sh start    # install pkgs if missing, start all
#   scripts/slurm_test_cluster.sh start --nodes 16   # the same with 16 nodes
#                                          # (see NODES below; plain `start`
#                                          # goes back to the default 2)
#   scripts/slurm_test_cluster.sh stop     # stop daemons, remove netns/bridge
#   scripts/slurm_test_cluster.sh restart  # stop + start
#   scripts/slurm_test_cluster.sh status   # exit 0 iff up and all nodes usable
#   scripts/slurm_test_cluster.sh env      # print `export ...` lines (for eval)
#   scripts/slurm_test_cluster.sh smoke    # end-to-end check of a running
#                                          # cluster: sbatch+srun on all nodes,
#                                          # GPUs, TCP between nodes, sacct
#   scripts/slurm_test_cluster.sh purge    # stop + delete the state directory
#                                          # (config, DB, job history)
#
#   eval "$(scripts/slurm_test_cluster.sh env)"
#   sbatch -N2 --ntasks-per-node=2 --gres=gpu:4 --wrap 'srun hostname'
#
# NODES (`--nodes N` of start/restart, else $HPC_TRAIN_SLURM_NODES, else 2;
# status/env/smoke read the size of the cluster that was last started from
# its slurm.conf; stop stops whatever is running)
#   N = 1..9   (default 2): hpcnode1 .. hpcnode<N>         e.g. hpcnode[1-2]
#   N = 10..32 (e.g. 16): two name prefixes and two numeric ranges, so that
#              host lists compress non-trivially: the first ceil(N/2) nodes
#              are zero-padded hpcnode01 .. hpcnodeNN, the others gpu-a1 ..
#              gpu-aM; for 16: hpcnode[01-08] and gpu-a[1-8] (Slurm sorts a
#              job's NodeList by name: gpu-a[1-8],hpcnode[01-08]). Besides
#              debug/gpu_p2/short (all nodes) there is one partition per
#              prefix: `hpc` = hpcnode[01-..] and `gpu_a` = gpu-a[1-..].
#   Node i (1-based, in that order) has IP 10.77.0.(10+i), a network
#   namespace named like the node and a veth pair hpcveth<i>/hpcveth<i>p
#   (names within Linux's 15-character interface-name limit). A `start`
#   with another N than the running cluster's restarts it (job ids and
#   history are kept; jobs still pending for nodes or partitions that no
#   longer exist are lost).
#
# WHAT `start` DOES / CREATES
#   * Installs (only when missing; checked with dpkg, so re-runs are fast):
#       slurmctld slurmd slurm-client munge slurmdbd mariadb-server
#     via `apt-get update` (once) + `apt-get install -y --no-install-recommends`.
#     Packages are never removed again.
#     Optional (for `srun --container=BUNDLE`, see OCI CONTAINERS): crun,
#     installed the same way when missing, but a failure is only a warning
#     (HPC_TRAIN_SLURM_OCI=0: neither installed nor configured).
#   * Everything else lives in ONE state directory ($HPC_TRAIN_SLURM_DIR,
#     default /tmp/hpc-train-slurm):
#       etc/slurm.conf etc/gres.conf etc/cgroup.conf   (regenerated each start)
#       etc/oci.conf etc/oci-runtime  (only when crun or runc is installed;
#                          regenerated each start, see OCI CONTAINERS)
#       etc/slurmdbd.conf  (mode 600, owner root = SlurmUser)
#       munge/munge.key    (generated once; private munged, own socket)
#       mysql/             (private MariaDB datadir, 127.0.0.1:$DB_PORT only)
#       spool/ctld spool/slurmd-<node>   (Slurm state; kept across stop/start,
#                                         so job ids and sacct history persist)
#       dev/<node>/nvidia[0-3]  (placeholder char devices backing Gres=gpu:4;
#                                same major/minor as /dev/null -> harmless)
#       run/ (pid files, sockets)   log/ (all daemon logs)
#     plus the lock file ${HPC_TRAIN_SLURM_DIR}.lock next to it (start, stop,
#     restart and purge are serialised: parallel `start`s are safe).
#   * Network: a bridge `hpcbr0` with 10.77.0.1/24 on the host (the
#     controller address) and, per compute node i, a network namespace
#     named like the node (`hpcnode<i>`) with a veth pair (host side
#     `hpcveth<i>`, ns side `eth0`) and address 10.77.0.(10+i). No default route, no NAT, no forwarding:
#     the namespaces can only reach 10.77.0.0/24.
#   * /etc/hosts: a marked block (# BEGIN/END hpc-train-slurm) mapping
#     hpcctl -> 10.77.0.1 and hpcnode<i> -> 10.77.0.(10+i). Updated in place
#     (works with bind-mounted /etc/hosts), removed again by `stop`.
#   * Daemons (started directly, no systemd): munged (as user munge),
#     mariadbd (as user mysql), slurmdbd, slurmctld (host netns), and one
#     slurmd per node: `nsenter --net=/run/netns/hpcnode<i> unshare --uts`
#     (the host's mount namespace, so /sys/fs/cgroup stays visible) with the UTS
#     hostname set to hpcnode<i>, then `slurmd -N hpcnode<i>`. So inside a job
#     `hostname` == SLURMD_NODENAME and resolves (via /etc/hosts) to the
#     node's own private IP - torch.distributed/MASTER_ADDR style rendezvous
#     between nodes works over real TCP. The file system is shared, so the
#     project's venv is visible to jobs (jobs run as the submitting user).
#   * Cluster "hpctrain": nodes hpcnode[1-2] (see NODES), each CPUs=16 (more than the
#     machine has: SlurmdParameters=config_overrides; 16 = the generic
#     profile's 4 GPUs x cpus_per_gpu 4, so a plain `hpc-train launcher=slurm`
#     fits a node), RealMemory=8000,
#     Gres=gpu:4. Partitions: debug (Default=YES) and gpu_p2, both with all
#     nodes and MaxTime=INFINITE, and short (all nodes, MaxTime=30 minutes,
#     for time-limit refusals); with 10+ nodes also hpc and gpu_a (NODES). select/cons_tres + CR_Core (memory is not a
#     consumable, --mem <= RealMemory is accepted). proctrack/linuxproc +
#     task/none (no cgroups needed), jobacct_gather/none, PreemptMode=OFF,
#     JobRequeue=1, KillWait=5, MinJobAge=300, fast scheduler loop.
#     Accounting via slurmdbd with AccountingStorageTRES=gres/gpu (so `sacct`
#     works and TRES shows gres/gpu=N); account `hpctest` exists and root is
#     a user in it (--account=hpctest works); AccountingStorageEnforce is
#     not set, so any user/account may submit.
#   * Waits (bounded, $HPC_TRAIN_SLURM_START_TIMEOUT s) until every node is
#     idle (or at least usable if clients' jobs already run on them);
#     otherwise prints the tails of all daemon logs and exits non-zero.
#   * Jobs across stop/start: `stop` cancels running jobs first (they are
#     recorded as CANCELLED); pending jobs survive a restart. `start` cancels
#     "ghost" jobs the controller still lists as running from before (their
#     processes are gone) and closes runaway jobs in the accounting DB.
#   * Idempotent: if the cluster is already healthy `start` returns at once;
#     a half-started cluster is torn down (like `stop`) and started afresh;
#     so is a running one started by a different version of this script or
#     with different HPC_TRAIN_SLURM_* settings.
#
# CLIENT ENVIRONMENT
#   Every process talking to the cluster needs
#       SLURM_CONF=$HPC_TRAIN_SLURM_DIR/etc/slurm.conf
#   (`env` prints it). Convenience: if /etc/slurm/slurm.conf does not exist
#   or is a symlink, `start` makes it a symlink to our slurm.conf, so plain
#   `sbatch`/`squeue`/`sacct` work without SLURM_CONF too (a regular file
#   there is never touched; set HPC_TRAIN_SLURM_LINK_ETC=0 to skip this).
#   `stop` removes the symlink again if it points to us. Inside jobs and
#   steps SLURM_CONF is set as well (slurmd exports its own SLURM_CONF into
#   the job environment), so srun/sacct/scontrol work there as is.
#   Nothing else is needed: no PATH changes, no MUNGE env (the munge socket
#   path is in slurm.conf). The cluster is one per machine (fixed netns,
#   bridge and ports); the ports listen on all host addresses (munge-auth).
#
# OCI CONTAINERS (Slurm 22.05: `srun --container=/ABS/BUNDLE cmd...`)
#   When crun (preferred) or runc is installed, `start` writes etc/oci.conf
#   (Slurm reads it from slurm.conf's directory) with RunTimeRun and
#   RunTimeQuery/Kill/Delete, all calling etc/oci-runtime, a wrapper that
#   runs `crun --root=$STATE_DIR/run/oci --cgroup-manager=disabled ...`
#   (or `runc --root=...`); on a hybrid cgroup v1+v2 host whose v2 hierarchy
#   has controllers (crun refuses those: "cgroups in hybrid mode not
#   supported") it first hides /sys/fs/cgroup/unified in a private mount
#   namespace. Container names are %n.%u.%j.%s.%t (node.user.job.step.task).
#   Without crun/runc there is no oci.conf and `--container` is ignored by
#   Slurm (as before). Slurm 22.05 limits (see its src/slurmd/slurmstepd/
#   container.c): ONE task per node per containerized step (-n2 on one node
#   fails), root = BUNDLE/rootfs whatever config.json says, process.args =
#   the srun command, the step's environment is appended to process.env (a
#   variable set in both: the step's value wins, so PATH is the caller's
#   unless --export=NONE), but the per-task variables (SLURM_PROCID,
#   SLURM_LOCALID, SLURM_NODEID, SLURMD_NODENAME, CUDA_VISIBLE_DEVICES, ...)
#   are missing (or stale copies from the caller's environment), the
#   modified config.json is written to SlurmdSpoolDir/oci-jobJJJJJ-SSSSS/
#   (the bundle itself is only read). RunTimeRun starts with `exec` so that
#   the task process is crun itself (dash does not exec the last command of
#   `sh -c`; an extra shell would die on SIGTERM/SIGUSR2 and orphan crun).
#   A test bundle with its own Python and the host venv's torch:
#   scripts/container_test_image.sh build DIR.
#
# CAVEATS
#   * sacct is asynchronous: right after a job ends, its record may for a
#     second or two still show JobName=allocation / no partition; poll.
#   * munged logs "Unauthorized credential for client UID=0" a few times per
#     srun; harmless.  slurmd/slurmctld log pmix "can not load PMIx library"
#     errors (libpmix is a Recommends, not installed); MpiDefault=none.
#   * Requeued jobs (scontrol requeue, submitit preemption/timeout) restart
#     after ~cred_expire (10 s) - Slurm's BeginTime delay.
#   * GPUs are placeholders: CUDA_VISIBLE_DEVICES/SLURM_JOB_GPUS are set,
#     but there is no CUDA device; nothing enforces CPU/memory/GPU limits.
#
# ENVIRONMENT VARIABLES (all optional)
#   HPC_TRAIN_SLURM_DIR            state dir           [/tmp/hpc-train-slurm]
#   HPC_TRAIN_SLURM_NODES          number of nodes (1-32; --nodes wins) [2]
#   HPC_TRAIN_SLURM_NET            /24 prefix of the private net  [10.77.0]
#   HPC_TRAIN_SLURM_CPUS           CPUs declared per node              [16]
#   HPC_TRAIN_SLURM_MEM_MB         RealMemory per node (MB)          [8000]
#   HPC_TRAIN_SLURM_GPUS           placeholder GPUs per node            [4]
#   HPC_TRAIN_SLURM_CLUSTER        ClusterName                   [hpctrain]
#   HPC_TRAIN_SLURM_START_TIMEOUT  seconds to wait for idle nodes      [90]
#   HPC_TRAIN_SLURM_LINK_ETC       1/0: manage /etc/slurm/slurm.conf link [1]
#   HPC_TRAIN_SLURM_CRED_EXPIRE    AuthInfo cred_expire (s); a requeued
#                                  job waits this long before it restarts;
#                                  a step must launch within it (min 5) [10]
#   HPC_TRAIN_SLURM_VERBOSE        non-empty: log the duration of each step
#   HPC_TRAIN_SLURM_OCI            1/0: install crun and write oci.conf    [1]
#   HPC_TRAIN_SLURM_CTLD_PORT / _SLURMD_PORT / _DBD_PORT / _DB_PORT
#                                  ports [6817 / 6818 / 6819 / 3399]
#
# REQUIREMENTS: root (start/stop/purge; status/env/smoke work as any user
# that can reach the cluster), iproute2 (`ip netns`), util-linux (`nsenter`,
# `unshare`, `runuser`, `setsid`), a mounted /sys/fs/cgroup, python3 (only
# for `smoke`), apt (only if the packages are missing). Tested with Debian 12
# (Slurm 22.05, MariaDB 10.11) in a container without systemd, with 2 and
# 16 nodes.
# =============================================================================
set -euo pipefail

STATE_DIR="${HPC_TRAIN_SLURM_DIR:-/tmp/hpc-train-slurm}"
NUM_NODES="${HPC_TRAIN_SLURM_NODES:-2}"  # start: --nodes wins; others: the running size
NET="${HPC_TRAIN_SLURM_NET:-10.77.0}"
NODE_CPUS="${HPC_TRAIN_SLURM_CPUS:-16}"
NODE_MEM="${HPC_TRAIN_SLURM_MEM_MB:-8000}"
NODE_GPUS="${HPC_TRAIN_SLURM_GPUS:-4}"
CLUSTER="${HPC_TRAIN_SLURM_CLUSTER:-hpctrain}"
START_TIMEOUT="${HPC_TRAIN_SLURM_START_TIMEOUT:-90}"
LINK_ETC="${HPC_TRAIN_SLURM_LINK_ETC:-1}"
CTLD_PORT="${HPC_TRAIN_SLURM_CTLD_PORT:-6817}"
SLURMD_PORT="${HPC_TRAIN_SLURM_SLURMD_PORT:-6818}"
DBD_PORT="${HPC_TRAIN_SLURM_DBD_PORT:-6819}"
DB_PORT="${HPC_TRAIN_SLURM_DB_PORT:-3399}"
CRED_EXPIRE="${HPC_TRAIN_SLURM_CRED_EXPIRE:-10}"
OCI="${HPC_TRAIN_SLURM_OCI:-1}"

PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
OPTIONAL_PACKAGES=(crun)  # OCI runtime for `srun --container` (HPC_TRAIN_SLURM_OCI=0: skipped)
BRIDGE=hpcbr0
NODE_PREFIX=hpcnode
NODE_PREFIX2=gpu-a  # second name prefix, for clusters of 10+ nodes
# every node name (= netns name) any size of this cluster may have used
NODE_RE="^(${NODE_PREFIX}|${NODE_PREFIX2})[0-9]+$"
CTL_ALIAS=hpcctl
CTL_IP="${NET}.1"
ACCOUNT=hpctest
HOSTS_BEGIN="# BEGIN hpc-train-slurm (${STATE_DIR})"
HOSTS_END="# END hpc-train-slurm (${STATE_DIR})"
ETC_LINK=/etc/slurm/slurm.conf

ETC="$STATE_DIR/etc"
RUN="$STATE_DIR/run"
LOG="$STATE_DIR/log"
SPOOL="$STATE_DIR/spool"
MUNGE_DIR="$STATE_DIR/munge"
MUNGE_RUN="$RUN/munge"
MUNGE_SOCK="$MUNGE_RUN/munge.socket.2"
DB_DIR="$STATE_DIR/mysql"
DB_RUN="$RUN/mysqld"
DB_SOCK="$DB_RUN/mysqld.sock"
SLURM_CONF_FILE="$ETC/slurm.conf"
# Every daemon we start carries this variable; `stop` uses it (besides pid
# files and `ip netns pids`) to find strays of exactly this instance.
MARK_VAR=HPC_TRAIN_SLURM_DAEMON
MARK="${MARK_VAR}=${STATE_DIR}"

log() { printf '[slurm-test-cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
vlog() { [ -z "${HPC_TRAIN_SLURM_VERBOSE:-}" ] || log "$@"; }

# node i (1-based) of NUM_NODES: see NODES in the header
first_group() { if [ "$NUM_NODES" -le 9 ]; then echo "$NUM_NODES"; else echo $(((NUM_NODES + 1) / 2)); fi; }
node_name() {
  if [ "$NUM_NODES" -le 9 ]; then echo "${NODE_PREFIX}$1"
  elif [ "$1" -le "$(first_group)" ]; then printf '%s%02d\n' "$NODE_PREFIX" "$1"
  else echo "${NODE_PREFIX2}$(($1 - $(first_group)))"; fi
}
node_ip() { echo "${NET}.$((10 + $1))"; }
# range PREFIX FIRST LAST [WIDTH] -> PREFIX[FIRST-LAST] (numbers zero-padded to WIDTH)
range() {
  local a b; a="$(printf "%0${4:-1}d" "$2")"; b="$(printf "%0${4:-1}d" "$3")"
  if [ "$2" -eq "$3" ]; then echo "$1$a"; else echo "$1[$a-$b]"; fi
}
# group_list 1|2: the nodes of the first (hpcnode...) or second (gpu-a...) prefix
group_list() {
  local a; a="$(first_group)"
  if [ "$NUM_NODES" -le 9 ]; then range "$NODE_PREFIX" 1 "$NUM_NODES"
  elif [ "$1" = 1 ]; then range "$NODE_PREFIX" 1 "$a" 2
  else range "$NODE_PREFIX2" 1 $((NUM_NODES - a)); fi
}
node_list() { if [ "$NUM_NODES" -le 9 ]; then group_list 1; else echo "$(group_list 1),$(group_list 2)"; fi; }
# size of the cluster last started (from its slurm.conf); empty if none
configured_nodes() { [ -r "$SLURM_CONF_FILE" ] && grep -c '^NodeName=' "$SLURM_CONF_FILE" || true; }

validate() {
  { [[ "$NUM_NODES" =~ ^[1-9][0-9]?$ ]] && [ "$NUM_NODES" -le 32 ]; } || die "the number of nodes must be 1..32 (got '$NUM_NODES')"
  [[ "$NET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "HPC_TRAIN_SLURM_NET must look like 10.77.0"
  case "$STATE_DIR" in /*) ;; *) die "HPC_TRAIN_SLURM_DIR must be an absolute path";; esac
  [ "$STATE_DIR" != / ] || die "refusing STATE_DIR=/"
}

need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (namespaces, daemons, apt)"; }

export SLURM_CONF="$SLURM_CONF_FILE"

# ----------------------------------------------------------------- packages
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

install_packages() {
  local missing=() optional=() p
  for p in "${PACKAGES[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  if [ "$OCI" = 1 ] && ! command -v crun >/dev/null && ! command -v runc >/dev/null; then
    for p in "${OPTIONAL_PACKAGES[@]}"; do pkg_installed "$p" || optional+=("$p"); done
  fi
  for p in ip nsenter unshare runuser setsid flock; do
    command -v "$p" >/dev/null || die "missing command '$p' (iproute2/util-linux)"
  done
  [ "${#missing[@]}" -eq 0 ] && [ "${#optional[@]}" -eq 0 ] && return 0
  log "installing: ${missing[*]} ${optional[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get update -qq >"/tmp/hpc-train-slurm-apt.log" 2>&1; then
    [ "${#missing[@]}" -eq 0 ] && { log "WARNING: apt-get update failed: no ${optional[*]} (srun --container is ignored)"; return 0; }
    cat /tmp/hpc-train-slurm-apt.log >&2; die "apt-get update failed"
  fi
  # optional packages (crun): a failure is only a warning
  if [ "${#optional[@]}" -gt 0 ] &&
    ! apt-get install -y -qq --no-install-recommends "${optional[@]}" >>"/tmp/hpc-train-slurm-apt.log" 2>&1; then
    log "WARNING: could not install ${optional[*]}: srun --container will be ignored (no oci.conf)"
  fi
  [ "${#missing[@]}" -eq 0 ] && return 0
  # policy-rc.d: keep the packages' init scripts from starting system daemons
  local prc=/usr/sbin/policy-rc.d created_prc=0
  if [ ! -e "$prc" ]; then printf '#!/bin/sh\nexit 101\n' >"$prc"; chmod 755 "$prc"; created_prc=1; fi
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"/tmp/hpc-train-slurm-apt.log" 2>&1; then
    [ "$created_prc" -eq 1 ] && rm -f "$prc"
    tail -n 30 /tmp/hpc-train-slurm-apt.log >&2; die "apt-get install failed"
  fi
  [ "$created_prc" -eq 1 ] && rm -f "$prc"
  return 0
}

# ---------------------------------------------------------------- processes
# alive = exists and is not a zombie (PID 1 of a container may not reap);
# via /proc so that `status` works for non-root users too
pid_alive() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] || return 1
  local st; st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
# shellcheck disable=SC2015  # "|| true" is meant to cover both commands
pidfile_pid() { [ -s "$1" ] && tr -dc '0-9' 2>/dev/null <"$1" || true; }
# (a pid file a non-root caller cannot read counts as alive)
pidfile_alive() { { [ -e "$1" ] && [ ! -r "$1" ]; } || pid_alive "$(pidfile_pid "$1")"; }

# pids of processes whose environment carries our exact marker
marked_pids() {
  local d pid
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    [ "$pid" = "$$" ] && continue
    if tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qxF "$MARK"; then echo "$pid"; fi
  done
}

# kill_pids SECONDS pid... : TERM, wait up to SECONDS, then KILL
kill_pids() {
  local wait_s="$1"; shift
  local pids=() p
  for p in "$@"; do pid_alive "$p" && pids+=("$p"); done
  [ "${#pids[@]}" -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  local end=$((SECONDS + wait_s)) alive
  while :; do
    alive=()
    for p in "${pids[@]}"; do pid_alive "$p" && alive+=("$p"); done
    [ "${#alive[@]}" -eq 0 ] && return 0
    [ "$SECONDS" -ge "$end" ] && break
    sleep 0.2
  done
  kill -KILL "${alive[@]}" 2>/dev/null || true
  sleep 0.2
}

# ----------------------------------------------------------------- network
setup_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    # refuse to shadow a subnet that something else on the host already uses
    if ip -4 route show | grep -qE "^${NET//./\\.}\.0/24 "; then
      die "${NET}.0/24 is already routed on this host; set HPC_TRAIN_SLURM_NET"
    fi
    ip link add "$BRIDGE" type bridge
  fi
  ip addr replace "${CTL_IP}/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local i ns veth
  for i in $(seq 1 "$NUM_NODES"); do
    ns="$(node_name "$i")"; veth="hpcveth$i"
    ip netns list | awk '{print $1}' | grep -qxF "$ns" || ip netns add "$ns"
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
      ip link del "$veth" 2>/dev/null || true
      ip link add "$veth" type veth peer name "${veth}p"
      ip link set "${veth}p" netns "$ns"
      ip -n "$ns" link set "${veth}p" name eth0
    fi
    ip link set "$veth" master "$BRIDGE"
    ip link set "$veth" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "$(node_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

teardown_network() {
  local ns i
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "$NODE_RE" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  for i in $(ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -E '^hpcveth[0-9]+$' || true); do
    ip link del "$i" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

# write /etc/hosts in place (it may be a bind mount that cannot be renamed)
hosts_update() {
  local tmp; tmp="$(mktemp)"
  awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' /etc/hosts >"$tmp"
  if [ "${1:-add}" = add ]; then
    {
      echo "$HOSTS_BEGIN"
      echo "${CTL_IP} ${CTL_ALIAS}"
      local i; for i in $(seq 1 "$NUM_NODES"); do echo "$(node_ip "$i") $(node_name "$i")"; done
      echo "$HOSTS_END"
    } >>"$tmp"
  fi
  if ! cmp -s "$tmp" /etc/hosts && ! cat "$tmp" >/etc/hosts 2>/dev/null; then
    log "WARNING: cannot write /etc/hosts: node names will not resolve (Slurm itself uses the IPs)"
  fi
  rm -f "$tmp"
}

# ------------------------------------------------------------------ config
write_config() {
  install -d -m 755 "$STATE_DIR" "$ETC" "$RUN" "$LOG" "$SPOOL" "$SPOOL/ctld" "$STATE_DIR/dev"
  install -d -m 700 -o munge -g munge "$MUNGE_DIR"
  install -d -m 755 -o munge -g munge "$MUNGE_RUN"
  install -d -m 755 -o mysql -g mysql "$DB_RUN"
  install -d -m 750 -o mysql -g mysql "$DB_DIR"
  install -d -m 755 -o mysql -g mysql "$LOG/mysql"

  if [ ! -s "$MUNGE_DIR/munge.key" ]; then
    dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
  fi
  chown munge:munge "$MUNGE_DIR/munge.key"; chmod 400 "$MUNGE_DIR/munge.key"

  if [ ! -s "$ETC/.dbpass" ]; then
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$ETC/.dbpass")
  fi

  local i n gpu_last=$((NODE_GPUS - 1)) host; host="$(hostname -s)"
  for i in $(seq 1 "$NUM_NODES"); do
    n="$(node_name "$i")"
    install -d -m 755 "$SPOOL/slurmd-$n" "$STATE_DIR/dev/$n"
    for g in $(seq 0 "$gpu_last"); do
      local dev="$STATE_DIR/dev/$n/nvidia$g"
      [ -c "$dev" ] || { rm -f "$dev"; mknod -m 666 "$dev" c 1 3; }
    done
  done

  local MAX_ARRAY_SIZE=201
  [ "$NUM_NODES" -ge 10 ] && MAX_ARRAY_SIZE=1001
  cat >"$SLURM_CONF_FILE.tmp" <<EOF
# Generated by scripts/slurm_test_cluster.sh - do not edit (rewritten on start)
ClusterName=${CLUSTER}
SlurmctldHost=${host}(${CTL_IP})
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays the restart of a requeued job (default 120 s)
AuthInfo=socket=${MUNGE_SOCK},cred_expire=${CRED_EXPIRE}
StateSaveLocation=${SPOOL}/ctld
SlurmdSpoolDir=${SPOOL}/slurmd-%n
SlurmctldPidFile=${RUN}/slurmctld.pid
SlurmdPidFile=${RUN}/slurmd-%n.pid
SlurmctldLogFile=${LOG}/slurmctld.log
SlurmdLogFile=${LOG}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# timeouts: generous for a loaded 2-core CI box, but fast kill/cancel
SlurmctldTimeout=120
SlurmdTimeout=300
MessageTimeout=20
UnkillableStepTimeout=120
InactiveLimit=0
KillWait=5
Waittime=0
MinJobAge=300
JobRequeue=1
# The suite's small cluster cuts sweeps into arrays at 200 tasks, so that a sweep of a few hundred held jobs shows
# the cut; the big one (10+ nodes, the scale tests) keeps Slurm's default 1001 for its 3,000-job sweep.
MaxArraySize=${MAX_ARRAY_SIZE}
# scheduling
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/none
PreemptMode=OFF
GresTypes=gpu
# accounting
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=${CTL_IP}
AccountingStoragePort=${DBD_PORT}
# for slurmdbd connections the munge socket is given here, not by AuthInfo
AccountingStoragePass=${MUNGE_SOCK}
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment,job_env,job_script
JobCompType=jobcomp/none
MailProg=/bin/true
# nodes & partitions
EOF
  for i in $(seq 1 "$NUM_NODES"); do
    n="$(node_name "$i")"
    echo "NodeName=${n} NodeAddr=$(node_ip "$i") NodeHostname=${n} CPUs=${NODE_CPUS} Boards=1 SocketsPerBoard=1 CoresPerSocket=${NODE_CPUS} ThreadsPerCore=1 RealMemory=${NODE_MEM} Gres=gpu:${NODE_GPUS} State=UNKNOWN" >>"$SLURM_CONF_FILE.tmp"
  done
  cat >>"$SLURM_CONF_FILE.tmp" <<EOF
PartitionName=debug Nodes=$(node_list) Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu_p2 Nodes=$(node_list) Default=NO MaxTime=INFINITE State=UP
PartitionName=short Nodes=$(node_list) Default=NO MaxTime=30 State=UP
EOF
  if [ "$NUM_NODES" -ge 10 ]; then
    echo "PartitionName=hpc Nodes=$(group_list 1) Default=NO MaxTime=INFINITE State=UP" >>"$SLURM_CONF_FILE.tmp"
    echo "PartitionName=gpu_a Nodes=$(group_list 2) Default=NO MaxTime=INFINITE State=UP" >>"$SLURM_CONF_FILE.tmp"
  fi
  mv -f "$SLURM_CONF_FILE.tmp" "$SLURM_CONF_FILE"; chmod 644 "$SLURM_CONF_FILE"

  {
    echo "# Generated by scripts/slurm_test_cluster.sh"
    echo "AutoDetect=off"
    for i in $(seq 1 "$NUM_NODES"); do
      n="$(node_name "$i")"
      echo "NodeName=${n} Name=gpu File=${STATE_DIR}/dev/${n}/nvidia[0-${gpu_last}]"
    done
  } >"$ETC/gres.conf"
  chmod 644 "$ETC/gres.conf"

  # slurmd 22.05 always initialises its cgroup plugin (it needs a mounted
  # /sys/fs/cgroup, v1 or v2) even though proctrack/task do not use cgroups.
  printf '# Generated by scripts/slurm_test_cluster.sh (no cgroup enforcement)\nCgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$ETC/cgroup.conf"
  chmod 644 "$ETC/cgroup.conf"

  (umask 077; cat >"$ETC/slurmdbd.conf" <<EOF
# Generated by scripts/slurm_test_cluster.sh
AuthType=auth/munge
AuthInfo=socket=${MUNGE_SOCK}
DbdHost=localhost
DbdPort=${DBD_PORT}
SlurmUser=root
DebugLevel=info
LogFile=${LOG}/slurmdbd.log
PidFile=${RUN}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=${DB_PORT}
StorageUser=slurm
StoragePass=$(cat "$ETC/.dbpass")
StorageLoc=slurm_acct_db
EOF
  )
  chown root:root "$ETC/slurmdbd.conf"; chmod 600 "$ETC/slurmdbd.conf"

  write_oci_config

  if [ "$LINK_ETC" = 1 ]; then
    install -d -m 755 /etc/slurm
    if [ -L "$ETC_LINK" ] || [ ! -e "$ETC_LINK" ]; then
      ln -sfn "$SLURM_CONF_FILE" "$ETC_LINK"
    else
      log "WARNING: $ETC_LINK is a regular file; not replacing it - clients need SLURM_CONF=$SLURM_CONF_FILE"
    fi
  fi
}

# oci.conf (+ the runtime wrapper it calls) when crun or runc is installed;
# otherwise none (Slurm then ignores --container). See OCI CONTAINERS.
write_oci_config() {
  local rt="" wrapper="$ETC/oci-runtime" name="%n.%u.%j.%s.%t"
  rm -f "$ETC/oci.conf" "$wrapper"
  [ "$OCI" = 1 ] || return 0
  rt="$(command -v crun || command -v runc || true)"
  [ -n "$rt" ] || return 0
  # the one wrapper of the project's tests (launcher=local's runtime too): crun or runc with --root=$RUN/oci
  bash "$(dirname "${BASH_SOURCE[0]}")/container_test_image.sh" runtime "$wrapper" "$RUN/oci"
  cat >"$ETC/oci.conf.tmp" <<EOF
# Generated by scripts/slurm_test_cluster.sh - do not edit (rewritten on start)
# Slurm 22.05 OCI runtime (srun/sbatch/salloc --container=/ABS/BUNDLE) via ${rt##*/}.
# Patterns: %b the bundle Slurm generates in SlurmdSpoolDir, %n node, %u user,
# %j job, %s step, %t task (22.05 knows no %U and no RunTimeEnvExclude).
RunTimeRun="exec $wrapper run --bundle %b $name"
RunTimeQuery="$wrapper state $name"
RunTimeKill="$wrapper kill --all $name SIGTERM"
RunTimeDelete="$wrapper delete --force $name"
EOF
  chmod 644 "$ETC/oci.conf.tmp"; mv -f "$ETC/oci.conf.tmp" "$ETC/oci.conf"
}

# ----------------------------------------------------------------- daemons
# run a daemon with our marker in its environment and without the lock fd
mark_env() { env "$MARK" SLURM_CONF="$SLURM_CONF_FILE" "$@" 9>&-; }

wait_for() {  # wait_for SECONDS DESCRIPTION CMD... ; polls CMD every 0.3 s
  local t="$1" what="$2"; shift 2
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -ge "$end" ] && { log "timed out waiting for $what"; return 1; }
    sleep 0.3
  done
}

start_munge() {
  pidfile_alive "$MUNGE_RUN/munged.pid" && return 0
  rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock"
  mark_env runuser -u munge -- /usr/sbin/munged \
    --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCK" \
    --pid-file="$MUNGE_RUN/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" --num-threads=4 \
    </dev/null >>"$LOG/munged.stdout" 2>&1
  wait_for 15 munged sh -c "munge -n -S '$MUNGE_SOCK' | unmunge -S '$MUNGE_SOCK'"
}

db() { mariadb --no-defaults -S "$DB_SOCK" -uroot "$@"; }

start_mariadb() {
  if [ ! -d "$DB_DIR/mysql" ]; then
    log "initialising MariaDB datadir $DB_DIR"
    mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR" \
      --auth-root-authentication-method=socket --skip-test-db \
      >"$LOG/mariadb-install.log" 2>&1 || { tail -n 20 "$LOG/mariadb-install.log" >&2; return 1; }
  fi
  if ! pidfile_alive "$DB_RUN/mysqld.pid"; then
    rm -f "$DB_SOCK"
    mark_env setsid -f /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR" \
      --socket="$DB_SOCK" --pid-file="$DB_RUN/mysqld.pid" --port="$DB_PORT" \
      --bind-address=127.0.0.1 --skip-name-resolve --log-error="$LOG/mysql/mariadb.log" \
      --innodb-buffer-pool-size=512M --innodb-lock-wait-timeout=900 \
      --max-connections=100 </dev/null >>"$LOG/mariadb.stdout" 2>&1
  fi
  wait_for 60 mariadb mariadb-admin --no-defaults -S "$DB_SOCK" -uroot ping || return 1
  local pw; pw="$(cat "$ETC/.dbpass")"
  db -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pw';
    ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
    ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    FLUSH PRIVILEGES;"
}

start_slurmdbd() {
  pidfile_alive "$RUN/slurmdbd.pid" ||
    mark_env /usr/sbin/slurmdbd </dev/null >>"$LOG/slurmdbd.stdout" 2>&1
  wait_for 60 slurmdbd sacctmgr -n list cluster || return 1
}

register_accounts() {
  sacctmgr -n -P list cluster format=cluster | grep -qxF "$CLUSTER" ||
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  sacctmgr -n -P list account "$ACCOUNT" format=account | grep -qxF "$ACCOUNT" ||
    sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description="hpc_train tests" Organization=hpctest >/dev/null
  sacctmgr -n -P list assoc cluster="$CLUSTER" account="$ACCOUNT" user=root format=user | grep -qxF root ||
    sacctmgr -i add user root Account="$ACCOUNT" Cluster="$CLUSTER" >/dev/null
}

start_slurmctld() {
  pidfile_alive "$RUN/slurmctld.pid" ||
    mark_env /usr/sbin/slurmctld -f "$SLURM_CONF_FILE" </dev/null >>"$LOG/slurmctld.stdout" 2>&1
  wait_for 60 slurmctld scontrol ping || return 1
}

start_slurmd() {
  local i n
  for i in $(seq 1 "$NUM_NODES"); do
    n="$(node_name "$i")"
    pidfile_alive "$RUN/slurmd-$n.pid" && continue
    # own netns (own IP) + own UTS namespace (hostname == node name).
    # nsenter rather than `ip netns exec`: the latter remounts /sys, which
    # hides /sys/fs/cgroup and slurmd 22.05 refuses to start without it.
    # shellcheck disable=SC2016  # $1/$@ are expanded by the inner sh
    nsenter --net="/run/netns/$n" -- unshare --uts -- /bin/sh -c \
      'hostname "$1" && shift && exec "$@"' sh "$n" \
      env "$MARK" SLURM_CONF="$SLURM_CONF_FILE" /usr/sbin/slurmd -f "$SLURM_CONF_FILE" -N "$n" \
      </dev/null >>"$LOG/slurmd-$n.stdout" 2>&1 9>&-
  done
}

# prints "node|state" for every configured node
node_states() { timeout 30 sinfo -h -N -p debug -o '%N|%T' 2>/dev/null | sort -u; }

nodes_ready() {  # all nodes usable; with arg 'idle': all idle
  local states want="${1:-usable}" ok=0 n s
  states="$(node_states)" || return 1
  while IFS='|' read -r n s; do
    [ -n "$n" ] || continue
    case "$want:$s" in
      idle:idle|usable:idle|usable:mixed|usable:allocated|usable:completing|usable:planned) ok=$((ok + 1)) ;;
      *) return 1 ;;
    esac
  done <<<"$states"
  [ "$ok" -eq "$NUM_NODES" ]
}

daemons_alive() {
  local i
  pidfile_alive "$MUNGE_RUN/munged.pid" && pidfile_alive "$DB_RUN/mysqld.pid" &&
    pidfile_alive "$RUN/slurmdbd.pid" && pidfile_alive "$RUN/slurmctld.pid" || return 1
  for i in $(seq 1 "$NUM_NODES"); do
    pidfile_alive "$RUN/slurmd-$(node_name "$i").pid" || return 1
  done
}

network_ok() {
  local i
  ip link show "$BRIDGE" >/dev/null 2>&1 || return 1
  for i in $(seq 1 "$NUM_NODES"); do
    [ -e "/run/netns/$(node_name "$i")" ] || return 1
    [ "$(id -u)" -ne 0 ] && continue  # entering a netns needs root
    ip -n "$(node_name "$i")" -4 addr show eth0 2>/dev/null | grep -qF " $(node_ip "$i")/" || return 1
  done
}

healthy() { [ -f "$SLURM_CONF_FILE" ] && daemons_alive && network_ok && nodes_ready usable; }

# fingerprint of this script + settings; a running cluster started with a
# different one is restarted by `start` (so config changes take effect)
config_stamp() {
  { cat "${BASH_SOURCE[0]}"; echo "$STATE_DIR $NUM_NODES $NET $NODE_CPUS $NODE_MEM $NODE_GPUS $CLUSTER" \
      "$LINK_ETC $CTLD_PORT $SLURMD_PORT $DBD_PORT $DB_PORT $CRED_EXPIRE $(hostname -s)" \
      "$OCI $(command -v crun || command -v runc || true)"; } | sha256sum | cut -c1-16
}
stamp_matches() { [ "$(cat "$RUN/config.stamp" 2>/dev/null)" = "$(config_stamp)" ]; }

cancel_ghost_jobs() {
  cancel_active_jobs "$CTLD_EPOCH"
  # DB records of jobs the controller lost (e.g. after kill -9): close them
  timeout 20 sacctmgr -i list runawayjobs >/dev/null 2>&1 || true
}
wait_nodes_usable() { wait_nodes usable; }
# all nodes idle, or (if the jobs of a client already run) at least usable
wait_nodes_idle() { wait_nodes idle 10 || nodes_ready usable; }

# wait_nodes idle|usable [TIMEOUT]
wait_nodes() {
  local end=$((SECONDS + ${2:-$START_TIMEOUT})) last_resume=0 n s
  while :; do
    nodes_ready "$1" && return 0
    [ "$SECONDS" -ge "$end" ] && return 1
    # nodes drained/down from an earlier life of the cluster: resume them
    if [ $((SECONDS - last_resume)) -ge 5 ]; then
      last_resume=$SECONDS
      while IFS='|' read -r n s; do
        case "$s" in
          drain*|down*|fail*|*maint*) scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true ;;
        esac
      done <<<"$(node_states)"
    fi
    sleep 0.5
  done
}

# cancel_active_jobs EPOCH: cancel running/completing/suspended jobs that
# started before EPOCH (0 = all), wait (bounded) until they are gone.
# Used by `stop` (all jobs) and by `start` (ghosts whose processes `stop`
# killed: they started before this slurmctld did).
cancel_active_jobs() {
  local before="$1" ids=() id st t
  pidfile_alive "$RUN/slurmctld.pid" || return 0
  timeout 10 scontrol ping >/dev/null 2>&1 || return 0
  while read -r id st; do
    [ -n "$id" ] || continue
    if [ "$before" -ne 0 ]; then
      t="$(date -d "$st" +%s 2>/dev/null || echo 0)"
      [ "$t" -lt "$before" ] || continue
    fi
    ids+=("$id")
  done < <(timeout 20 squeue -h -t R,CG,S,CF -o '%A %S' 2>/dev/null || true)
  [ "${#ids[@]}" -gt 0 ] || return 0
  log "cancelling jobs: ${ids[*]}"
  timeout 20 scancel "${ids[@]}" 2>/dev/null || true
  local end=$((SECONDS + 20))
  while [ "$SECONDS" -lt "$end" ]; do
    timeout 10 squeue -h -j "$(IFS=,; echo "${ids[*]}")" -t R,CG,S,CF -o %A 2>/dev/null | grep -q . || return 0
    sleep 0.5
  done
}

dump_logs() {
  local f
  log "daemon processes alive? munged:$(pidfile_alive "$MUNGE_RUN/munged.pid" && echo y || echo n)" \
    "mariadb:$(pidfile_alive "$DB_RUN/mysqld.pid" && echo y || echo n)" \
    "slurmdbd:$(pidfile_alive "$RUN/slurmdbd.pid" && echo y || echo n)" \
    "slurmctld:$(pidfile_alive "$RUN/slurmctld.pid" && echo y || echo n)"
  sinfo -N 2>&1 | sed 's/^/  sinfo: /' >&2 || true
  for f in "$MUNGE_DIR/munged.log" "$LOG"/*.log "$LOG"/*/*.log "$LOG"/*.stdout; do
    [ -s "$f" ] || continue
    [ -f "$f" ] || continue
    echo "----- last lines of $f -----" >&2
    tail -n 25 "$f" >&2
  done
}

# ---------------------------------------------------------------- commands
cmd_stop() {
  need_root
  local n f t0=$SECONDS pids=() ctld
  # 0. cancel running jobs cleanly so they are recorded as CANCELLED instead
  #    of lingering as RUNNING ghosts in the saved controller state
  cancel_active_jobs 0
  vlog "  jobs cancelled at +$((SECONDS - t0)) s"
  # 1. the controller (saves its state on SIGTERM) and, in parallel,
  #    everything inside the node namespaces (slurmd, slurmstepd, job tasks;
  #    job processes get only 3 s before SIGKILL)
  ctld="$(pidfile_pid "$RUN/slurmctld.pid")"
  pid_alive "$ctld" && kill -TERM "$ctld" 2>/dev/null
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "$NODE_RE" || true); do
    mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$n" 2>/dev/null || true)
  done
  for f in "$RUN"/slurmd-*.pid; do [ -f "$f" ] && pids+=("$(pidfile_pid "$f")"); done
  kill_pids 3 "${pids[@]}"
  kill_pids 15 "$ctld"
  vlog "  slurmd/slurmctld stopped at +$((SECONDS - t0)) s"
  # 2. then slurmdbd (after the controller has flushed accounting to it)
  kill_pids 15 "$(pidfile_pid "$RUN/slurmdbd.pid")"
  # 3. then database and munge
  kill_pids 30 "$(pidfile_pid "$DB_RUN/mysqld.pid")" "$(pidfile_pid "$MUNGE_RUN/munged.pid")"
  vlog "  slurmdbd/mariadb/munged stopped at +$((SECONDS - t0)) s"
  # 4. strays of this instance (e.g. pid file lost)
  mapfile -t pids < <(marked_pids)
  [ "${#pids[@]}" -gt 0 ] && { log "killing stray daemons: ${pids[*]}"; kill_pids 10 "${pids[@]}"; }
  rm -f "$RUN"/*.pid "$RUN"/config.stamp "$MUNGE_RUN"/munged.pid "$DB_RUN"/mysqld.pid 2>/dev/null || true
  teardown_network
  if [ -f /etc/hosts ]; then hosts_update remove; fi
  if [ -L "$ETC_LINK" ] && [ "$(readlink "$ETC_LINK")" = "$SLURM_CONF_FILE" ]; then rm -f "$ETC_LINK"; fi
  log "stopped (in $((SECONDS - t0)) s)"
}

cmd_start() {
  need_root
  validate
  local t0=$SECONDS running
  if healthy; then
    if stamp_matches; then
      log "already running and healthy (SLURM_CONF=$SLURM_CONF_FILE)"
      return 0
    fi
    log "running, but script or settings changed: restarting"
  elif running="$(configured_nodes)" && [ -n "$running" ] && [ "$running" != "$NUM_NODES" ] &&
    pidfile_alive "$RUN/slurmctld.pid"; then
    log "running with $running nodes: restarting with $NUM_NODES"
  fi
  install_packages
  # half-started or stale: clean everything of this instance first
  cmd_stop 2>/dev/null || true
  log "starting cluster '$CLUSTER' ($NUM_NODES nodes) in $STATE_DIR"
  write_config
  setup_network
  hosts_update add
  local ok=1 step
  CTLD_EPOCH=$(date +%s)
  for step in start_munge start_mariadb start_slurmdbd register_accounts \
    start_slurmctld start_slurmd wait_nodes_usable cancel_ghost_jobs wait_nodes_idle; do
    "$step" || { ok=0; log "step $step failed"; break; }
    vlog "  $step done at +$((SECONDS - t0)) s"
  done
  if [ "$ok" -ne 1 ]; then
    log "cluster did not come up within the time limits"
    dump_logs
    return 1
  fi
  config_stamp >"$RUN/config.stamp"
  log "up in $((SECONDS - t0)) s; use: export SLURM_CONF=$SLURM_CONF_FILE"
  sinfo
}

cmd_status() {
  if [ -f "$SLURM_CONF_FILE" ] && sinfo 2>/dev/null; then
    if healthy; then echo "status: up (all $NUM_NODES nodes usable)"; return 0; fi
    echo "status: DEGRADED"; return 1
  fi
  echo "status: down"; return 1
}

# End-to-end check of a running cluster (about 5-10 s with 2 nodes): a batch
# job on all nodes with srun, GPUs and a TCP connection from every node to the
# first, then scontrol/sacct.
cmd_smoke() {
  [ "$NUM_NODES" -ge 2 ] || die "smoke needs >= 2 nodes"
  healthy || die "cluster not healthy; run: $0 start"
  local dir job st i out
  dir="$(mktemp -d /tmp/hpc-train-slurm-smoke.XXXXXX)"; chmod 755 "$dir"
  cat >"$dir/tcp.py" <<'PYEOF'
import os, socket, subprocess, time
rank, ntasks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
first = subprocess.check_output(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]).split()[0].decode()
if rank == 0:
    srv = socket.create_server(("0.0.0.0", 29517)); srv.settimeout(60)
    for _ in range(ntasks - 1):
        conn, addr = srv.accept()
        print(f"TCP rank0@{socket.gethostname()} got '{conn.recv(100).decode()}' from {addr[0]}", flush=True)
else:
    for _ in range(120):
        try:
            conn = socket.create_connection((first, 29517), timeout=2); break
        except OSError:
            time.sleep(0.25)
    conn.sendall(f"hello from rank{rank}@{socket.gethostname()}".encode())
PYEOF
  job="$(sbatch --parsable -N"$NUM_NODES" --ntasks-per-node=1 --gres=gpu:"$NODE_GPUS" -A "$ACCOUNT" -p gpu_p2 \
    -t 5 -o "$dir/out" --wrap "srun bash -c 'echo TASK \$SLURM_PROCID host=\$(hostname) ip=\$(hostname -I) gpus=\$CUDA_VISIBLE_DEVICES'; srun python3 $dir/tcp.py")" ||
    die "sbatch failed"
  for i in $(seq 1 240); do
    st="$(squeue -h -j "$job" -o %T 2>/dev/null || true)"; [ -z "$st" ] && break; sleep 0.5
  done
  out="$(cat "$dir/out" 2>/dev/null || true)"; echo "$out"
  scontrol show job -d "$job" | grep -E 'JobState|TRES=|JOB_GRES|TresPerNode'
  for i in $(seq 1 20); do  # accounting is asynchronous: poll briefly
    st="$(sacct -n -X -P -j "$job" -o State 2>/dev/null || true)"; [ "$st" = COMPLETED ] && break; sleep 0.5
  done
  sacct -j "$job" -o JobID,JobName,Partition,Account,AllocTRES%45,State,NodeList%30
  rm -rf "$dir"
  [ "$st" = COMPLETED ] || die "smoke job $job: sacct state '$st'"
  [ "$(grep -c '^TASK' <<<"$out")" -eq "$NUM_NODES" ] || die "expected $NUM_NODES tasks"
  [ "$(grep '^TASK' <<<"$out" | awk '{print $3}' | sort -u | wc -l)" -eq "$NUM_NODES" ] ||
    die "tasks did not run on $NUM_NODES nodes"
  [ "$(grep -c '^TCP .* got .hello from rank' <<<"$out")" -eq $((NUM_NODES - 1)) ] ||
    die "no TCP connection from every node to the first"
  echo "smoke: OK (job $job)"
}

cmd_env() {
  echo "export SLURM_CONF=$SLURM_CONF_FILE"
  echo "export HPC_TRAIN_SLURM_DIR=$STATE_DIR"
}

# start/stop/restart/purge are serialised with a lock, so that e.g. several
# pytest-xdist workers may all call `start`: the first starts the cluster,
# the others wait and then find it healthy.
take_lock() {
  need_root
  exec 9>"${STATE_DIR%/}.lock"
  flock -w 600 9 || die "timed out waiting for lock ${STATE_DIR%/}.lock"
}

COMMAND="${1:-}"; [ "$#" -gt 0 ] && shift
NODES_ARG=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --nodes) [ "$#" -ge 2 ] || die "--nodes needs a number"; NODES_ARG="$2"; shift 2 ;;
    --nodes=*) NODES_ARG="${1#--nodes=}"; shift ;;
    *) die "unknown option '$1' (usage: $0 start|restart [--nodes N])" ;;
  esac
done
case "$COMMAND" in
  start|restart) [ -z "$NODES_ARG" ] || NUM_NODES="$NODES_ARG" ;;
  *) [ -z "$NODES_ARG" ] || die "--nodes is an option of start and restart"
     NUM_NODES="$(configured_nodes)"; NUM_NODES="${NUM_NODES:-${HPC_TRAIN_SLURM_NODES:-2}}" ;;
esac

case "$COMMAND" in
  install) take_lock; install_packages ;;
  start) take_lock; cmd_start ;;
  stop) take_lock; cmd_stop ;;
  restart) take_lock; cmd_stop; cmd_start ;;
  status) cmd_status ;;
  env) cmd_env ;;
  smoke) cmd_smoke ;;
  purge) take_lock; cmd_stop; rm -rf --one-file-system "$STATE_DIR"; log "removed $STATE_DIR" ;;
  *) echo "usage: $0 {start [--nodes N]|stop|restart [--nodes N]|status|env|smoke|purge}" >&2; exit 2 ;;
esac
