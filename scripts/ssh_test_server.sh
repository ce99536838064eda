#!/usr/bin/env bash
# =============================================================================
# ssh_test_server.sh - a REAL OpenSSH server in front of the local Slurm test
# cluster (scripts/slurm_test_cluster.sh), for the "submit from a laptop over
# SSH" tests (Debian/Ubuntu, run as root).
# =============================================================================
#
# USAGE
#   scripts/ssh_test_server.sh install  # only install sshd if missing
#   scripts/ssh_test_server.sh start    # install sshd if missing, set up the
#                                       # users, keys, venvs; start the server
#   scripts/ssh_test_server.sh stop     # stop the test sshd (users/keys stay)
#   scripts/ssh_test_server.sh status   # exit 0 iff it answers with its host key
#   scripts/ssh_test_server.sh env      # print `export ...` lines (for eval)
#   scripts/ssh_test_server.sh smoke    # end-to-end check of a running server:
#                                       # login, refused logins, the venvs, a
#                                       # Slurm job submitted over ssh (sacct)
#
#   eval "$(scripts/ssh_test_server.sh env)"
#   runuser -u hpclaptop -- ssh testcluster 'sbatch --parsable --wrap hostname'
#
# The Slurm test cluster is not started here (tests/conftest.py's slurm_cluster
# fixture does that); start it first, so that `start` can put the cluster user
# into its accounting (otherwise it warns and skips that step).
#
# THE TWO SIDES: two Unix users of this machine
#   hpclaptop   the "laptop": has the ssh client side (keys, config,
#               known_hosts) and its own venv; no Slurm configuration.
#   hpccluster  the "cluster's login side": the only user sshd lets in; its
#               jobs run on the Slurm test cluster (same file system).
#   Both are created when missing (useradd -m -s /bin/bash), their homes are
#   mode 0700 (neither can read, let alone run, the other's files: a path of one
#   side that leaks to the other fails there), their password field is `*` (no
#   password, but not "locked": sshd with UsePAM no refuses key logins to locked
#   accounts, i.e. a password field starting with `!`).
#
# WHAT `start` DOES / CREATES
#   * Installs openssh-server (apt-get, --no-install-recommends, log in
#     /tmp/hpc-train-ssh-apt.log) only when /usr/sbin/sshd or the ssh client
#     tools are missing; the distribution's own ssh service is kept from starting
#     (policy-rc.d while installing) and disabled/stopped afterwards: nothing
#     listens on port 22 because of this script.
#   * State dir $HPC_TRAIN_SSH_DIR (default /tmp/hpc-train-ssh):
#       ssh_host_ed25519_key(.pub)  the host key (generated once, kept)
#       sshd_config                 (regenerated each start; a running server
#                                    with another config is restarted)
#       sshd.pid  sshd.log          (sshd -E: LogLevel VERBOSE)
#       sshd.stdout                 (what sshd printed before daemonising)
#     plus the lock file ${HPC_TRAIN_SSH_DIR}.lock (start/stop serialised).
#   * sshd: `/usr/sbin/sshd -f sshd_config -E sshd.log` (daemon, no systemd),
#     127.0.0.1:$HPC_TRAIN_SSH_PORT only (a free port, kept); public keys only (no
#     passwords, no PAM), AllowUsers hpccluster, MaxSessions 100, MaxStartups
#     100:30:200, StrictModes yes, sftp subsystem (scp uses it), and
#       SetEnv SLURM_CONF=<the Slurm test cluster's slurm.conf>
#     so every command run over ssh talks to the test cluster. The path comes
#     from $HPC_TRAIN_SSH_SLURM_CONF, else `slurm_test_cluster.sh env`.
#     /run/sshd (privilege separation dir) is created.
#   * Keys of the laptop (in ~hpclaptop/.ssh, generated once, no passphrase):
#       id_ed25519   authorized in ~hpccluster/.ssh/authorized_keys
#       id_unknown   NEVER authorized (for "authentication refused" tests)
#     ~hpclaptop/.ssh/known_hosts: the server's host key for
#     `[127.0.0.1]:PORT` and for `testcluster` (NOT for localhost: a login to
#     `hpccluster@localhost:PORT` with StrictHostKeyChecking=yes fails with
#     "Host key verification failed", for "unknown host key" tests).
#     ~hpclaptop/.ssh/config: a marked block (# BEGIN/END hpc-train-ssh-test)
#     at the top of the file, replaced on each start; the rest is kept:
#       Host testcluster          127.0.0.1:PORT, User hpccluster, id_ed25519
#       Host testcluster-unknown  the same with id_unknown (HostKeyAlias
#                                 testcluster): `ssh testcluster-unknown true`
#                                 fails with "Permission denied (publickey)"
#     (A login as another user, e.g. nobody@127.0.0.1:PORT, is refused too:
#     AllowUsers.)
#   * Python environments (python3 -m venv --without-pip, owned by each user),
#     each with a file hpc_train_base.pth in its site-packages:
#       import site; site.addsitedir('<project venv site-packages>')
#     (addsitedir, so the .pth files there - the editable install of hpc_train
#     - are processed too):
#       ~hpclaptop/venv       the laptop's Python
#       ~hpccluster/venv      the cluster's Python
#       ~hpccluster/venv-old  the same plus a fake hpc_train-0.0.1.dist-info in
#                             its own site-packages (which precedes the
#                             project's): importlib.metadata.version("hpc-train")
#                             says 0.0.1 there (version mismatch tests); `import
#                             hpc_train` still imports the checkout.
#     The project venv is $HPC_TRAIN_SSH_BASE_PYTHON (or --base-python PATH),
#     default .venv/bin/python of the checkout this script lives in. Its own
#     interpreter may live where the two users cannot go (e.g. pyenv under
#     /root, mode 0700): then the venvs are made from /usr/bin/pythonX.Y of the
#     same X.Y (C extensions need the same minor version), or from
#     $HPC_TRAIN_SSH_VENV_PYTHON. The venvs have no console scripts: run
#     `<venv>/bin/python -m hpc_train.cli` etc. (the project venv's own scripts
#     name its interpreter, which the two users may not be able to run).
#     Checked on each start: each venv imports hpc_train and reports the
#     expected version, and the laptop cannot run the cluster's Python.
#   * Slurm: hpccluster is added (once) to the test cluster's account
#     (hpctest, $HPC_TRAIN_SSH_SLURM_ACCOUNT) with sacctmgr, as root is by
#     slurm_test_cluster.sh. (That cluster does not set
#     AccountingStorageEnforce, so sbatch works without it too; with it jobs
#     get Account=hpctest and --account=hpctest works.)
#   * Finally one login as the laptop (clean environment, BatchMode) checks
#     that `ssh testcluster` works and sees SLURM_CONF.
#   * Idempotent: run again, it finds the server up with the same config and
#     only re-checks the users, keys and venvs (about 1-2 s). Parallel starts
#     are serialised by the lock.
#
# WHAT `stop` DOES: ends this test sshd only - the pid in its pid file, if
# that process is an sshd started with our sshd_config - and its session
# processes (its children: open connections are cut, as by a network drop;
# commands they ran keep running unless the cut ends them - a non-tty session
# gets no SIGHUP). Users, keys, venvs and the state dir are left.
#
# ENVIRONMENT VARIABLES (all optional)
#   HPC_TRAIN_SSH_DIR           state dir                     [/tmp/hpc-train-ssh]
#   HPC_TRAIN_SSH_PORT          port on 127.0.0.1  [the last start's, else a free one]
#   HPC_TRAIN_SSH_BASE_PYTHON   the project venv's python [<checkout>/.venv/bin/python]
#   HPC_TRAIN_SSH_VENV_PYTHON   interpreter the user venvs are made from  [see above]
#   HPC_TRAIN_SSH_SLURM_CONF    slurm.conf for SetEnv [from slurm_test_cluster.sh env]
#   HPC_TRAIN_SSH_SLURM_ACCOUNT Slurm account of hpccluster             [hpctest]
#   HPC_TRAIN_SSH_START_TIMEOUT seconds to wait for the port to answer     [20]
#
# REQUIREMENTS: root (start/stop/smoke; status/env work as any user), apt
# (only if sshd is missing), util-linux (runuser, flock), python3 of the
# project venv's minor version. Tested on Debian 12 (OpenSSH 9.2, Slurm 22.05)
# in a container without systemd.
# =============================================================================
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$SCRIPT_DIR")"
SLURM_SCRIPT="$SCRIPT_DIR/slurm_test_cluster.sh"

STATE_DIR="${HPC_TRAIN_SSH_DIR:-/tmp/hpc-train-ssh}"
BASE_PYTHON="${HPC_TRAIN_SSH_BASE_PYTHON:-$REPO_DIR/.venv/bin/python}"
VENV_PYTHON="${HPC_TRAIN_SSH_VENV_PYTHON:-}"
SLURM_ACCOUNT="${HPC_TRAIN_SSH_SLURM_ACCOUNT:-hpctest}"
START_TIMEOUT="${HPC_TRAIN_SSH_START_TIMEOUT:-20}"

LISTEN=127.0.0.1
ALIAS=testcluster
LAPTOP_USER=hpclaptop
CLUSTER_USER=hpccluster
SSHD=/usr/sbin/sshd
SFTP_SERVER=/usr/lib/openssh/sftp-server
APT_LOG=/tmp/hpc-train-ssh-apt.log
BLOCK_BEGIN="# BEGIN hpc-train-ssh-test (written by scripts/ssh_test_server.sh start)"
BLOCK_END="# END hpc-train-ssh-test"
FAKE_OLD_VERSION=0.0.1
# a clean PATH for what runs as the two users and for sshd itself
CLEAN_PATH=/usr/local/bin:/usr/bin:/bin

STATE_DIR="${STATE_DIR%/}"
CONFIG="$STATE_DIR/sshd_config"
HOST_KEY="$STATE_DIR/ssh_host_ed25519_key"
PID_FILE="$STATE_DIR/sshd.pid"
LOG_FILE="$STATE_DIR/sshd.log"
# The port: HPC_TRAIN_SSH_PORT, else the one this state dir's server was given (its sshd_config), else a free one
# that start picks (pick_port): a fixed default would meet whatever else listens on this machine.
PORT="${HPC_TRAIN_SSH_PORT:-$(sed -n 's/^Port //p' "$CONFIG" 2>/dev/null | head -n 1)}"
# how known_hosts names 127.0.0.1:PORT
known_name() { if [ "$PORT" = 22 ]; then KNOWN_NAME="$LISTEN"; else KNOWN_NAME="[$LISTEN]:$PORT"; fi; }
known_name

log() { printf '[ssh-test-server] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (users, sshd, apt)"; }

validate() {
  [ -n "$STATE_DIR" ] || die "refusing HPC_TRAIN_SSH_DIR=/"
  case "$STATE_DIR" in /*) ;; *) die "HPC_TRAIN_SSH_DIR must be an absolute path (got '$STATE_DIR')" ;; esac
  [[ "$STATE_DIR" =~ ^[A-Za-z0-9_./-]+$ ]] || die "HPC_TRAIN_SSH_DIR may hold only letters, digits and _./- (got '$STATE_DIR')"
  [ -z "$PORT" ] || { [[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ]; } ||
    die "HPC_TRAIN_SSH_PORT must be a port number (got '$PORT')"
  [[ "$START_TIMEOUT" =~ ^[0-9]+$ ]] || die "HPC_TRAIN_SSH_START_TIMEOUT must be a number of seconds"
}

home_of() {
  local h; h="$(getent passwd "$1" | cut -d: -f6)"
  echo "${h:-/home/$1}"
}

# as_user USER CMD...: run CMD as USER with a clean environment, from /
as_user() {
  local u="$1"; shift
  (cd / && runuser -u "$u" -- env -i HOME="$(home_of "$u")" USER="$u" LOGNAME="$u" PATH="$CLEAN_PATH" LANG=C.UTF-8 "$@")
}

# --------------------------------------------------------------- processes
pid_alive() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] || return 1
  local st; st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
pidfile_pid() { if [ -s "$1" ]; then tr -dc '0-9' <"$1" 2>/dev/null || true; fi; }

# the pid of OUR sshd listener (pid file + its command line names our config)
our_pid() {
  local pid; pid="$(pidfile_pid "$PID_FILE")"
  pid_alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-f $CONFIG -E " || return 1
  echo "$pid"
}

# kill_pids SECONDS pid... : TERM, wait up to SECONDS, then KILL
kill_pids() {
  local wait_s="$1"; shift
  local pids=() p alive end
  for p in "$@"; do pid_alive "$p" && pids+=("$p"); done
  [ "${#pids[@]}" -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  end=$((SECONDS + wait_s))
  while :; do
    alive=()
    for p in "${pids[@]}"; do pid_alive "$p" && alive+=("$p"); done
    [ "${#alive[@]}" -eq 0 ] && return 0
    [ "$SECONDS" -ge "$end" ] && break
    sleep 0.1
  done
  kill -KILL "${alive[@]}" 2>/dev/null || true
  sleep 0.1
}

children_of() {
  local d
  for d in /proc/[0-9]*; do
    [ "$(awk '{print $4}' "$d/stat" 2>/dev/null)" = "$1" ] && echo "${d#/proc/}"
  done
  return 0
}

# "ssh-ed25519 AAAA..." of our host key, and what the port answers with
host_pub() { awk '{print $1" "$2}' "$HOST_KEY.pub" 2>/dev/null; }
port_key() {
  timeout 10 ssh-keyscan -T 3 -t ed25519 -p "$PORT" "$LISTEN" 2>/dev/null |
    awk '$2=="ssh-ed25519"{print $2" "$3; exit}' || true
}
answers() { local k; k="$(host_pub)"; [ -n "$k" ] && [ "$(port_key)" = "$k" ]; }
port_taken() { timeout 3 bash -c ": <>/dev/tcp/$LISTEN/$PORT" 2>/dev/null; }

# --------------------------------------------------------------- packages
install_packages() {
  local p missing=0
  [ -x "$SSHD" ] || missing=1
  for p in ssh ssh-keygen ssh-keyscan; do command -v "$p" >/dev/null || missing=1; done
  if [ "$missing" -eq 1 ]; then
    log "installing openssh-server (log: $APT_LOG)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get update -qq >"$APT_LOG" 2>&1; then
      tail -n 30 "$APT_LOG" >&2; die "apt-get update failed (log: $APT_LOG)"
    fi
    # policy-rc.d: keep the package's init script from starting the system sshd
    local prc=/usr/sbin/policy-rc.d created_prc=0
    if [ ! -e "$prc" ]; then printf '#!/bin/sh\nexit 101\n' >"$prc"; chmod 755 "$prc"; created_prc=1; fi
    if ! apt-get install -y -qq --no-install-recommends openssh-server >>"$APT_LOG" 2>&1; then
      [ "$created_prc" -eq 1 ] && rm -f "$prc"
      tail -n 30 "$APT_LOG" >&2; die "apt-get install openssh-server failed (log: $APT_LOG)"
    fi
    [ "$created_prc" -eq 1 ] && rm -f "$prc"
    stop_distro_sshd
    [ -x "$SSHD" ] || die "openssh-server is installed but $SSHD is missing"
  fi
  for p in ssh ssh-keygen ssh-keyscan runuser flock getent useradd usermod timeout; do
    command -v "$p" >/dev/null || die "missing command '$p' (openssh-client/util-linux/passwd/coreutils)"
  done
}

# the distribution's ssh service (port 22): disabled, and stopped if it runs
stop_distro_sshd() {
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now ssh.service ssh.socket >>"$APT_LOG" 2>&1 || true
  elif command -v update-rc.d >/dev/null; then
    update-rc.d ssh disable >>"$APT_LOG" 2>&1 || true
  fi
  local pid; pid="$(pidfile_pid /run/sshd.pid)"
  if pid_alive "$pid" && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$SSHD" ]; then
    log "stopping the distribution's sshd (pid $pid, port 22) that the package started"
    kill_pids 5 "$pid"
  fi
}

# ------------------------------------------------------------------ files
# put_file OWNER MODE PATH < content: write PATH (atomically, only if changed)
put_file() {
  local owner="$1" mode="$2" path="$3" tmp
  tmp="$(mktemp "$path.XXXXXX")"
  cat >"$tmp"
  if [ -f "$path" ] && cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
  else
    chown "$owner:" "$tmp"; chmod "$mode" "$tmp"
    mv -f "$tmp" "$path"
  fi
  chown "$owner:" "$path"; chmod "$mode" "$path"
}

# ------------------------------------------------------------------ users
ensure_user() {
  local u="$1" home
  if ! id -u "$u" >/dev/null 2>&1; then
    useradd -m -s /bin/bash "$u" || die "useradd $u failed"
    log "created user $u"
  fi
  home="$(home_of "$u")"
  [ -d "$home" ] || install -d -m 700 -o "$u" -g "$(id -gn "$u")" "$home"
  chmod 700 "$home"
  # '*': no password, but not locked ('!...'), which sshd (UsePAM no) refuses
  [ "$(getent shadow "$u" | cut -d: -f2)" = '*' ] || usermod -p '*' "$u"
  install -d -m 700 -o "$u" -g "$(id -gn "$u")" "$home/.ssh"
}

# ensure_key USER FILE: an ed25519 key pair without passphrase
ensure_key() {
  local u="$1" f="$2"
  if [ ! -s "$f" ]; then
    rm -f "$f" "$f.pub"
    as_user "$u" ssh-keygen -q -t ed25519 -N '' -C "$u@hpc-train-ssh-test" -f "$f" </dev/null >/dev/null ||
      die "ssh-keygen for $u ($f) failed"
  elif [ ! -s "$f.pub" ]; then
    as_user "$u" ssh-keygen -y -f "$f" >"$f.pub" || die "cannot derive $f.pub"
  fi
  chown "$u:" "$f" "$f.pub"; chmod 600 "$f"; chmod 644 "$f.pub"
}

setup_keys() {
  local lhome chome key unknown hostkey kh tmp h
  lhome="$(home_of "$LAPTOP_USER")"; chome="$(home_of "$CLUSTER_USER")"
  ensure_key "$LAPTOP_USER" "$lhome/.ssh/id_ed25519"
  ensure_key "$LAPTOP_USER" "$lhome/.ssh/id_unknown"
  key="$(awk '{print $1" "$2}' "$lhome/.ssh/id_ed25519.pub")"
  unknown="$(awk '{print $2}' "$lhome/.ssh/id_unknown.pub")"

  # authorized_keys: the laptop's key added once; id_unknown never in it
  {
    if [ -f "$chome/.ssh/authorized_keys" ]; then grep -vF -- "$unknown" "$chome/.ssh/authorized_keys" || true; fi
    grep -qF -- "${key#* }" "$chome/.ssh/authorized_keys" 2>/dev/null || echo "$key $LAPTOP_USER@hpc-train-ssh-test"
  } | put_file "$CLUSTER_USER" 600 "$chome/.ssh/authorized_keys"

  # known_hosts: our host key for [127.0.0.1]:PORT and the alias (old
  # entries for these names, hashed ones too, removed first)
  hostkey="$(host_pub)"
  kh="$lhome/.ssh/known_hosts"
  tmp="$(mktemp)"
  [ -f "$kh" ] && cat "$kh" >"$tmp"
  for h in "$KNOWN_NAME" "$ALIAS"; do ssh-keygen -q -R "$h" -f "$tmp" >/dev/null 2>&1 || true; done
  rm -f "$tmp.old"
  { cat "$tmp"; echo "$KNOWN_NAME $hostkey"; echo "$ALIAS $hostkey"; } | put_file "$LAPTOP_USER" 600 "$kh"
  rm -f "$tmp"

  # ~/.ssh/config: our block first (ssh takes the first value it finds)
  {
    echo "$BLOCK_BEGIN"
    printf 'Host %s\n    HostName %s\n    Port %s\n    User %s\n    IdentityFile ~/.ssh/id_ed25519\n    IdentitiesOnly yes\n' \
      "$ALIAS" "$LISTEN" "$PORT" "$CLUSTER_USER"
    printf 'Host %s-unknown\n    HostName %s\n    Port %s\n    User %s\n    IdentityFile ~/.ssh/id_unknown\n    IdentitiesOnly yes\n    HostKeyAlias %s\n' \
      "$ALIAS" "$LISTEN" "$PORT" "$CLUSTER_USER" "$ALIAS"
    echo "$BLOCK_END"
    if [ -f "$lhome/.ssh/config" ]; then
      awk -v b="$BLOCK_BEGIN" -v e="$BLOCK_END" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' "$lhome/.ssh/config"
    fi
  } | put_file "$LAPTOP_USER" 600 "$lhome/.ssh/config"
}

# ------------------------------------------------------------------ venvs
BASE_SITE="" BASE_XY="" BASE_VERSION=""

probe_base_python() {
  [ -x "$BASE_PYTHON" ] || die "no project Python at $BASE_PYTHON (set HPC_TRAIN_SSH_BASE_PYTHON or --base-python)"
  local out
  out="$("$BASE_PYTHON" -c 'import importlib.metadata as m, sys, sysconfig
print(sysconfig.get_paths()["purelib"]); print("%d.%d" % sys.version_info[:2]); print(m.version("hpc-train"))')" ||
    die "$BASE_PYTHON cannot tell its site-packages or hpc-train's version (is hpc_train installed in it?)"
  { read -r BASE_SITE; read -r BASE_XY; read -r BASE_VERSION; } <<<"$out"
  [[ "$BASE_SITE" =~ ^/[A-Za-z0-9_./+-]+$ ]] || die "unexpected site-packages path '$BASE_SITE'"
  local u
  for u in "$LAPTOP_USER" "$CLUSTER_USER"; do
    as_user "$u" test -r "$BASE_SITE" -a -x "$BASE_SITE" ||
      die "$u cannot read the project venv's $BASE_SITE (make it and its parents world-readable)"
  done
}

# the interpreter the user venvs are made from: one both users can run, of
# the project venv's X.Y
pick_venv_python() {
  local cands=() c base
  if [ -n "$VENV_PYTHON" ]; then cands=("$VENV_PYTHON")
  else
    base="$("$BASE_PYTHON" -c 'import sys; print(getattr(sys, "_base_executable", "") or sys.executable)')"
    cands=("$base" "/usr/bin/python$BASE_XY" "/usr/local/bin/python$BASE_XY")
  fi
  for c in "${cands[@]}"; do
    [ -x "$c" ] || continue
    [ "$(as_user "$LAPTOP_USER" "$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$BASE_XY" ] || continue
    as_user "$CLUSTER_USER" "$c" -c '' 2>/dev/null || continue
    VENV_PYTHON="$c"; return 0
  done
  die "no Python $BASE_XY that $LAPTOP_USER and $CLUSTER_USER can run (tried: ${cands[*]}); install python$BASE_XY or set HPC_TRAIN_SSH_VENV_PYTHON"
}

# setup_venv USER DIR [FAKE_VERSION]
setup_venv() {
  local u="$1" dir="$2" fake="${3:-}" py sp di
  py="$dir/bin/python"
  if [ ! -f "$dir/pyvenv.cfg" ] ||
    [ "$(as_user "$u" "$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$BASE_XY" ]; then
    log "creating $dir (from $VENV_PYTHON)"
    as_user "$u" "$VENV_PYTHON" -m venv --without-pip --clear "$dir" || die "python -m venv $dir failed"
  fi
  sp="$(as_user "$u" "$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" ||
    die "$py does not run as $u"
  echo "import site; site.addsitedir('$BASE_SITE')" | put_file "$u" 644 "$sp/hpc_train_base.pth"
  if [ -n "$fake" ]; then
    di="$sp/hpc_train-$fake.dist-info"
    install -d -m 755 -o "$u" -g "$(id -gn "$u")" "$di"
    printf 'Metadata-Version: 2.1\nName: hpc-train\nVersion: %s\nSummary: a fake old hpc_train (scripts/ssh_test_server.sh)\n' "$fake" |
      put_file "$u" 644 "$di/METADATA"
  fi
}

# check_venv USER PYTHON EXPECTED_VERSION
check_venv() {
  local got
  got="$(as_user "$1" "$2" -c 'import hpc_train, importlib.metadata as m; print(m.version("hpc-train"))' 2>&1)" ||
    die "$2 (as $1) cannot import hpc_train: $got"
  [ "$got" = "$3" ] || die "$2 (as $1) reports hpc-train $got, expected $3"
}

setup_venvs() {
  local lhome chome
  lhome="$(home_of "$LAPTOP_USER")"; chome="$(home_of "$CLUSTER_USER")"
  probe_base_python
  pick_venv_python
  setup_venv "$LAPTOP_USER" "$lhome/venv"
  setup_venv "$CLUSTER_USER" "$chome/venv"
  setup_venv "$CLUSTER_USER" "$chome/venv-old" "$FAKE_OLD_VERSION"
  check_venv "$LAPTOP_USER" "$lhome/venv/bin/python" "$BASE_VERSION"
  check_venv "$CLUSTER_USER" "$chome/venv/bin/python" "$BASE_VERSION"
  check_venv "$CLUSTER_USER" "$chome/venv-old/bin/python" "$FAKE_OLD_VERSION"
  if as_user "$LAPTOP_USER" test -x "$chome/venv/bin/python"; then
    die "$LAPTOP_USER can reach $chome/venv/bin/python: the homes must be mode 0700"
  fi
}

# ------------------------------------------------------------------ slurm
slurm_conf_path() {
  local p="${HPC_TRAIN_SSH_SLURM_CONF:-}"
  if [ -z "$p" ] && [ -f "$SLURM_SCRIPT" ]; then
    p="$(bash "$SLURM_SCRIPT" env 2>/dev/null | sed -n 's/^export SLURM_CONF=//p' | tr -d "'\"" | head -n 1)"
  fi
  p="${p:-${SLURM_CONF:-}}"
  [ -z "$p" ] || [[ "$p" =~ ^/[A-Za-z0-9_./+-]+$ ]] || die "unusable slurm.conf path '$p' (absolute, no spaces or quotes)"
  echo "$p"
}

# hpccluster in the test cluster's account (idempotent); a warning when the
# cluster is not there
slurm_account() {
  local conf="$1" cluster out
  if [ -z "$conf" ] || [ ! -r "$conf" ] || ! command -v sacctmgr >/dev/null; then
    log "WARNING: no Slurm test cluster (slurm.conf '${conf:-?}'): $CLUSTER_USER not added to a Slurm account;" \
      "start it (scripts/slurm_test_cluster.sh start), then run this start again"
    return 0
  fi
  cluster="$(sed -n 's/^ClusterName=//p' "$conf" | head -n 1)"
  [ -n "$cluster" ] || die "no ClusterName in $conf"
  if ! out="$(SLURM_CONF="$conf" timeout 30 sacctmgr -n -P list assoc cluster="$cluster" account="$SLURM_ACCOUNT" \
    user="$CLUSTER_USER" format=user 2>&1)"; then
    log "WARNING: sacctmgr does not answer ($out): $CLUSTER_USER not added to Slurm account $SLURM_ACCOUNT"
    return 0
  fi
  grep -qxF "$CLUSTER_USER" <<<"$out" && return 0
  out="$(SLURM_CONF="$conf" timeout 30 sacctmgr -i add user "$CLUSTER_USER" Account="$SLURM_ACCOUNT" Cluster="$cluster" 2>&1)" ||
    die "sacctmgr could not add $CLUSTER_USER to account $SLURM_ACCOUNT of cluster $cluster: $out"
  log "added $CLUSTER_USER to Slurm account $SLURM_ACCOUNT (cluster $cluster)"
}

# ------------------------------------------------------------------- sshd
render_config() {
  cat <<EOF
# written by scripts/ssh_test_server.sh start - regenerated on each start
Port $PORT
ListenAddress $LISTEN
AddressFamily inet
HostKey $HOST_KEY
PidFile $PID_FILE
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthenticationMethods publickey
UsePAM no
PermitRootLogin no
AllowUsers $CLUSTER_USER
MaxSessions 100
MaxStartups 100:30:200
LoginGraceTime 30
StrictModes yes
LogLevel VERBOSE
ClientAliveInterval 0
PrintMotd no
PrintLastLog no
X11Forwarding no
EOF
  if [ -x "$SFTP_SERVER" ]; then echo "Subsystem sftp $SFTP_SERVER"; fi
  if [ -n "$1" ]; then echo "SetEnv SLURM_CONF=$1"; fi
}

dump_log() {
  local f
  for f in "$STATE_DIR/sshd.stdout" "$LOG_FILE"; do
    if [ -s "$f" ]; then echo "----- last lines of $f -----" >&2; tail -n 25 "$f" >&2; fi
  done
}

# The port start uses: HPC_TRAIN_SSH_PORT as given (a taken one is refused), else the recorded one while our sshd
# holds it or it is free, else a free one the kernel hands out (bound and released just before sshd binds it).
pick_port() {
  [ -n "${HPC_TRAIN_SSH_PORT:-}" ] && return 0
  if [ -n "$PORT" ] && { our_pid >/dev/null || ! port_taken; }; then return 0; fi
  PORT="$("$BASE_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')" ||
    die "could not find a free port with $BASE_PYTHON"
  known_name
  log "port $PORT: a free one (HPC_TRAIN_SSH_PORT sets one)"
}

port_refused() {
  if port_taken; then
    die "$LISTEN:$PORT is already in use by another process ($(ss -ltnpH "sport = :$PORT" 2>/dev/null | head -n 1)); set HPC_TRAIN_SSH_PORT"
  fi
}

start_sshd() {
  local pid end
  port_refused
  rm -f "$PID_FILE"
  # a clean environment: nothing of this shell's reaches the sessions
  env -i PATH="/usr/sbin:/usr/bin:/sbin:/bin" LANG=C.UTF-8 "$SSHD" -f "$CONFIG" -E "$LOG_FILE" \
    </dev/null >>"$STATE_DIR/sshd.stdout" 2>&1 9>&- || { dump_log; die "$SSHD -f $CONFIG failed to start"; }
  end=$((SECONDS + START_TIMEOUT))
  while :; do
    if pid="$(our_pid)" && answers; then return 0; fi
    if [ "$SECONDS" -ge "$end" ]; then
      dump_log; die "sshd does not answer on $LISTEN:$PORT after ${START_TIMEOUT}s"
    fi
    sleep 0.1
  done
}

stop_sshd() {
  local pid kids
  pid="$(our_pid)" || return 0
  # its children are the per-connection processes (sessions of open connections)
  mapfile -t kids < <(children_of "$pid")
  kill_pids 5 "$pid" "${kids[@]}"
  rm -f "$PID_FILE"
  log "stopped sshd (pid $pid${kids[*]:+, sessions ${kids[*]}})"
}

# one login as the laptop: the alias works and the session sees SLURM_CONF
check_login() {
  local conf="$1" out
  # shellcheck disable=SC2016  # expanded by the remote shell
  out="$(as_user "$LAPTOP_USER" ssh -o BatchMode=yes -o ConnectTimeout=10 "$ALIAS" \
    'echo "user=$(id -un) SLURM_CONF=${SLURM_CONF:-}"' 2>&1)" || { dump_log; die "ssh $ALIAS as $LAPTOP_USER failed: $out"; }
  [ "$out" = "user=$CLUSTER_USER SLURM_CONF=$conf" ] ||
    die "ssh $ALIAS as $LAPTOP_USER: expected 'user=$CLUSTER_USER SLURM_CONF=$conf', got '$out'"
}

# ---------------------------------------------------------------- commands
cmd_start() {
  need_root
  validate
  local t0=$SECONDS conf pid new err running=0
  install_packages
  ensure_user "$LAPTOP_USER"
  ensure_user "$CLUSTER_USER"
  install -d -m 755 "$STATE_DIR"
  install -d -m 755 -o root -g root /run/sshd
  if [ ! -s "$HOST_KEY" ] || [ ! -s "$HOST_KEY.pub" ]; then
    rm -f "$HOST_KEY" "$HOST_KEY.pub"
    ssh-keygen -q -t ed25519 -N '' -C "hpc-train-ssh-test" -f "$HOST_KEY" </dev/null >/dev/null || die "ssh-keygen (host key) failed"
  fi
  chmod 600 "$HOST_KEY"; chmod 644 "$HOST_KEY.pub"
  conf="$(slurm_conf_path)"
  [ -z "$conf" ] || [ -r "$conf" ] || log "WARNING: $conf does not exist (yet): is the Slurm test cluster started?"

  # the server first decided (and a taken port refused) before the laptop's
  # files are touched
  pick_port
  new="$(render_config "$conf")"
  if pid="$(our_pid)" && [ "$new" = "$(cat "$CONFIG" 2>/dev/null)" ] && answers; then
    running=1
  else
    if pid="$(our_pid)"; then log "sshd (pid $pid) runs with another config or does not answer: restarting"; stop_sshd; fi
    port_refused
    printf '%s\n' "$new" >"$CONFIG"; chmod 644 "$CONFIG"
    err="$("$SSHD" -t -f "$CONFIG" 2>&1)" || die "sshd rejects $CONFIG: $err"
  fi
  setup_keys
  setup_venvs
  slurm_account "$conf"
  if [ "$running" -eq 1 ]; then
    log "sshd already running (pid $pid, $LISTEN:$PORT)"
  else
    start_sshd
    log "sshd started (pid $(our_pid), $LISTEN:$PORT, log $LOG_FILE)"
  fi
  check_login "$conf"
  log "up in $((SECONDS - t0)) s: runuser -u $LAPTOP_USER -- ssh $ALIAS (eval \"\$($0 env)\")"
}

cmd_stop() {
  need_root
  if our_pid >/dev/null; then stop_sshd; else rm -f "$PID_FILE"; log "not running"; fi
}

cmd_status() {
  local pid
  if pid="$(our_pid)"; then
    if answers; then echo "status: up (sshd pid $pid, $LISTEN:$PORT, ssh $ALIAS as $LAPTOP_USER)"; return 0; fi
    echo "status: DEGRADED (sshd pid $pid runs but $LISTEN:$PORT does not answer with its host key)"; return 1
  fi
  echo "status: down"; return 1
}

cmd_env() {
  local lhome chome
  lhome="$(home_of "$LAPTOP_USER")"; chome="$(home_of "$CLUSTER_USER")"
  echo "export HPC_TRAIN_SSH_DIR=$STATE_DIR"
  echo "export HPC_TRAIN_SSH_PORT=$PORT"
  echo "export HPC_TRAIN_SSH_ALIAS=$ALIAS"
  echo "export HPC_TRAIN_SSH_LAPTOP_USER=$LAPTOP_USER"
  echo "export HPC_TRAIN_SSH_CLUSTER_USER=$CLUSTER_USER"
  echo "export HPC_TRAIN_SSH_LAPTOP_PYTHON=$lhome/venv/bin/python"
  echo "export HPC_TRAIN_SSH_CLUSTER_PYTHON=$chome/venv/bin/python"
  echo "export HPC_TRAIN_SSH_OLD_PYTHON=$chome/venv-old/bin/python"
}

# End-to-end check of a running server (a few seconds): logins allowed and
# refused, the venvs, and a Slurm job submitted over ssh that reads the
# checkout and writes in the cluster user's home, seen COMPLETED by sacct.
cmd_smoke() {
  need_root
  validate
  answers || die "the test sshd does not answer; run: $0 start"
  local conf chome out job st i tag
  conf="$(slurm_conf_path)"; chome="$(home_of "$CLUSTER_USER")"
  check_login "$conf"
  echo "login: ok ($ALIAS, SLURM_CONF=$conf)"
  out="$(as_user "$LAPTOP_USER" ssh -o BatchMode=yes "$ALIAS-unknown" true 2>&1)" && die "$ALIAS-unknown logged in"
  grep -q 'Permission denied' <<<"$out" || die "$ALIAS-unknown: $out"
  echo "unauthorized key: refused ($out)"
  out="$(as_user "$LAPTOP_USER" ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -p "$PORT" "$CLUSTER_USER@localhost" true 2>&1)" &&
    die "login to localhost (host key not known) succeeded"
  grep -q 'Host key verification failed' <<<"$out" || die "localhost: $out"
  echo "unknown host key: refused"
  out="$(as_user "$LAPTOP_USER" ssh -o BatchMode=yes -F none -o IdentitiesOnly=yes -i "$(home_of "$LAPTOP_USER")/.ssh/id_ed25519" \
    -o UserKnownHostsFile="$(home_of "$LAPTOP_USER")/.ssh/known_hosts" -p "$PORT" "nobody@$LISTEN" true 2>&1)" && die "nobody logged in"
  echo "other user: refused ($out)"
  eval "$(cmd_env)"
  for i in "$HPC_TRAIN_SSH_LAPTOP_PYTHON" "$HPC_TRAIN_SSH_CLUSTER_PYTHON" "$HPC_TRAIN_SSH_OLD_PYTHON"; do
    case "$i" in "$chome"/*) out="$CLUSTER_USER" ;; *) out="$LAPTOP_USER" ;; esac
    echo "$i ($out): hpc-train $(as_user "$out" "$i" -c 'import hpc_train, importlib.metadata as m; print(m.version("hpc-train"))')"
  done
  probe_base_python
  tag="hpc-train-ssh-smoke-$$"
  # the job script goes over ssh's stdin; the job runs as the cluster user
  # shellcheck disable=SC2016  # expanded by the job's shell on the cluster
  printf '#!/bin/bash\necho "host=$(hostname) user=$(id -un)"\n%s\n%s\n%s\n' \
    "ls $REPO_DIR >/dev/null && ls $REPO_DIR/.venv >/dev/null && echo read=ok" \
    "touch \$HOME/$tag.touched && echo write=ok" \
    "\$HOME/venv/bin/python -c 'import hpc_train, importlib.metadata as m; print(\"hpc-train\", m.version(\"hpc-train\"))'" |
    as_user "$LAPTOP_USER" ssh -o BatchMode=yes "$ALIAS" "cat > $tag.sh" || die "cannot write $tag.sh over ssh"
  job="$(as_user "$LAPTOP_USER" ssh -o BatchMode=yes "$ALIAS" "sbatch --parsable -J $tag -o $chome/$tag.out $tag.sh" 2>&1)" ||
    die "sbatch over ssh failed: $job"
  job="${job%%;*}"
  for i in $(seq 1 120); do
    st="$(SLURM_CONF="$conf" sacct -n -X -P -j "$job" -o State 2>/dev/null | head -n 1 || true)"
    case "$st" in COMPLETED|FAILED|CANCELLED*|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
    sleep 0.5
  done
  SLURM_CONF="$conf" sacct -X -j "$job" -o JobID,JobName%30,User,Account,State,NodeList
  cat "$chome/$tag.out" 2>/dev/null || true
  [ "$st" = COMPLETED ] || die "job $job: sacct state '$st'"
  if ! grep -qx 'read=ok' "$chome/$tag.out" || ! grep -qx 'write=ok' "$chome/$tag.out" ||
    ! grep -qx "hpc-train $BASE_VERSION" "$chome/$tag.out"; then
    die "job $job: unexpected output (see above)"
  fi
  rm -f "$chome/$tag.sh" "$chome/$tag.out" "$chome/$tag.touched"
  echo "smoke: OK (job $job)"
}

take_lock() {
  need_root
  validate
  exec 9>"$STATE_DIR.lock"
  flock -w 300 9 || die "timed out waiting for lock $STATE_DIR.lock"
}

COMMAND="${1:-}"; [ "$#" -gt 0 ] && shift
while [ "$#" -gt 0 ]; do
  case "$1" in
    --base-python) [ "$#" -ge 2 ] || die "--base-python needs a path"; BASE_PYTHON="$2"; shift 2 ;;
    --base-python=*) BASE_PYTHON="${1#--base-python=}"; shift ;;
    *) die "unknown option '$1' (usage: $0 start [--base-python PATH])" ;;
  esac
done

case "$COMMAND" in
  install) take_lock; install_packages ;;
  start) take_lock; cmd_start ;;
  stop) take_lock; cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  smoke) cmd_smoke ;;
  *) echo "usage: $0 {install|start [--base-python PATH]|stop|status|env|smoke}" >&2; exit 2 ;;
esac
