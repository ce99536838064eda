#!/usr/bin/env bash
# =============================================================================
# container_test_image.sh - build a small OCI bundle for tests of Slurm's
# OCI container support (`srun --container=DIR`, see oci.conf written by
# scripts/slurm_test_cluster.sh when crun or runc is installed).
# =============================================================================
#
# USAGE
#   scripts/container_test_image.sh build DIR   # build (or refresh) the bundle at DIR
#   scripts/container_test_image.sh check DIR   # run it once with crun/runc directly
#   scripts/container_test_image.sh runtime FILE STATE
#                                   # write FILE: the OCI runtime to give
#                                   # hpc-train's container.command for a
#                                   # launcher=local run (see RUNTIME)
#
# THE BUNDLE (DIR must be an absolute path; Slurm 22.05 always uses
# DIR/rootfs as root, whatever root.path says)
#   DIR/config.json   OCI runtime spec 1.0 (written from the template below)
#   DIR/rootfs/       a few directories and symlinks only (~100 KB):
#       /etc/hpc-train-test-image   marker: "hpc-train-test-image <version>"
#       /opt/image-python           the image's own Python environment: a venv
#                                   of Debian's /usr/bin/python3 (3.11), made
#                                   by hand (bin/python -> /usr/bin/python3.11,
#                                   pyvenv.cfg, empty site-packages); the
#                                   launching venv (the checkout's .venv or
#                                   $HPC_TRAIN_IMAGE_HOST_VENV) does not exist
#                                   inside the container.
#       bin lib lib64 sbin -> usr/... (Debian 12 is merged-/usr)
#       empty mount points for everything config.json mounts.
#   config.json mounts (nothing is copied: the build takes well under a second
#   and ~100 KB of disk):
#       /usr                      <- host /usr, read-only bind (Debian's python3
#                                    and libraries)
#       /etc/{hosts,passwd,group,nsswitch.conf,resolv.conf,ld.so.cache,localtime}
#                                 <- host files, read-only binds (node names
#                                    resolve, getpwuid works)
#       /opt/image-python/lib/python3.11/site-packages/<pkg>
#                                 <- the host venv's torch and its sibling
#                                    packages (torch torchgen functorch numpy
#                                    numpy.libs sympy mpmath filelock
#                                    typing_extensions networkx jinja2
#                                    markupsafe fsspec nvidia triton cuda and
#                                    their *.dist-info), read-only binds: the
#                                    SAME torch build as the host venv, at a
#                                    path that is not the host venv's
#       /proc /dev /dev/pts /dev/shm /dev/mqueue /sys /tmp (tmpfs) as usual
#   root.readonly=true; namespaces: pid, ipc, mount only (host network of
#   the node, node hostname); process.user 0:0 (the test cluster runs jobs
#   as root); process.env has the image's PATH
#   (/opt/image-python/bin:/usr/local/bin:/usr/bin:/bin) and
#   HPC_TRAIN_TEST_IMAGE=1; process.args/cwd are placeholders (Slurm replaces
#   args with the srun command; cwd stays as in config.json: "/").
#
# `build` is idempotent: it rewrites config.json and the marker only when
# they change and never deletes anything but its own stale mount points.
#
# RUNTIME (`runtime FILE STATE`: what launcher=local runs the bundle with)
#   FILE is a shell wrapper of crun (preferred) or runc with --root=STATE
#   (crun: --cgroup-manager=disabled): on a hybrid cgroup v1+v2 host whose v2
#   hierarchy has controllers, crun refuses to run ("cgroups in hybrid mode
#   not supported"), so the wrapper runs it in a private mount namespace
#   without /sys/fs/cgroup/unified. It is the runtime of the Slurm test
#   cluster's oci.conf (scripts/slurm_test_cluster.sh), without Slurm's
#   `state` quirk, for runs that need crun but no Slurm.
#
# ENVIRONMENT
#   HPC_TRAIN_IMAGE_HOST_VENV   venv whose torch is mounted [repo's .venv]
#   HPC_TRAIN_IMAGE_EXTRA       more of that venv's site-packages to bind, as
#                               words W (W and W-*.dist-info, each where it
#                               exists; W may be a glob such as
#                               opentelemetry_*): e.g. torchft and what it
#                               imports, for an image that runs replica
#                               groups                                 [none]
#   HPC_TRAIN_IMAGE_PYTHON      python in the image (must exist on the host
#                               under /usr)            [/usr/bin/python3.11]
# =============================================================================
set -euo pipefail

IMAGE_VERSION=1
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST_VENV="${HPC_TRAIN_IMAGE_HOST_VENV:-$REPO/.venv}"
IMAGE_PY_BIN="${HPC_TRAIN_IMAGE_PYTHON:-/usr/bin/python3.11}"
IMAGE_ENV=/opt/image-python
# torch and what it imports or may import (plain `import torch` needs torch,
# torchgen, numpy(+.libs), typing_extensions and, for the CUDA build, nvidia)
PACKAGES=(torch torchgen functorch numpy numpy.libs sympy mpmath filelock typing_extensions.py
  networkx jinja2 markupsafe fsspec nvidia triton cuda)
DIST_INFO=(torch sympy mpmath filelock typing_extensions networkx jinja2 markupsafe fsspec numpy triton
  'nvidia_*' 'cuda_*')
read -r -a EXTRA <<<"${HPC_TRAIN_IMAGE_EXTRA:-}"
PACKAGES+=("${EXTRA[@]}")
DIST_INFO+=("${EXTRA[@]}")
ETC_FILES=(hosts passwd group nsswitch.conf resolv.conf ld.so.cache localtime)

log() { printf '[container-test-image] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# JSON string literal (paths: escape backslash and double quote; no control characters)
json_str() {
  local s="${1//\\/\\\\}"; s="${s//\"/\\\"}"
  case "$s" in *[[:cntrl:]]*) die "control character in path '$1'";; esac
  printf '"%s"' "$s"
}

cmd_build() {
  local dir="${1:-}"
  [ -n "$dir" ] || die "usage: $0 build DIR"
  case "$dir" in /*) ;; *) die "DIR must be an absolute path (srun --container needs one)";; esac
  dir="${dir%/}"
  [ -x "$IMAGE_PY_BIN" ] || die "missing $IMAGE_PY_BIN (apt-get install python3)"
  local pyver; pyver="$("$IMAGE_PY_BIN" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  local host_sp="$HOST_VENV/lib/python$pyver/site-packages"
  [ -d "$host_sp/torch" ] || die "no torch for python$pyver in $HOST_VENV"
  local rootfs="$dir/rootfs" sp="$IMAGE_ENV/lib/python$pyver/site-packages"

  mkdir -p "$rootfs"
  # merged-/usr symlinks and mount points
  local l
  for l in bin lib lib64 sbin; do
    [ -L "$rootfs/$l" ] || { rm -rf "${rootfs:?}/$l"; ln -s "usr/$l" "$rootfs/$l"; }
  done
  mkdir -p "$rootfs"/{usr,proc,dev,sys,tmp,etc,root,run,var/tmp} "$rootfs$IMAGE_ENV/bin" "$rootfs$sp"
  chmod 1777 "$rootfs/tmp" "$rootfs/var/tmp"
  local f
  for f in "${ETC_FILES[@]}"; do [ -e "/etc/$f" ] && [ ! -e "$rootfs/etc/$f" ] && : >"$rootfs/etc/$f"; done
  # the image's python env (a venv of Debian's python3, made by hand: fast)
  ln -sfn "$IMAGE_PY_BIN" "$rootfs$IMAGE_ENV/bin/python"
  ln -sfn python "$rootfs$IMAGE_ENV/bin/python3"
  ln -sfn python "$rootfs$IMAGE_ENV/bin/python$pyver"
  [ -L "$rootfs$IMAGE_ENV/lib64" ] || ln -s lib "$rootfs$IMAGE_ENV/lib64"
  local cfg; cfg="home = $(dirname "$IMAGE_PY_BIN")
include-system-site-packages = false
version = $("$IMAGE_PY_BIN" -c 'import platform; print(platform.python_version())')
"
  [ "$(cat "$rootfs$IMAGE_ENV/pyvenv.cfg" 2>/dev/null)" = "${cfg%$'\n'}" ] || printf '%s' "$cfg" >"$rootfs$IMAGE_ENV/pyvenv.cfg"
  local marker="hpc-train-test-image $IMAGE_VERSION (OCI bundle $dir, built by scripts/container_test_image.sh)"
  [ "$(cat "$rootfs/etc/hpc-train-test-image" 2>/dev/null)" = "$marker" ] || echo "$marker" >"$rootfs/etc/hpc-train-test-image"

  # bind mounts of the host venv's torch & co. (mount points in the rootfs)
  local mounts=() src name pat
  for name in "${PACKAGES[@]}"; do
    [ -e "$host_sp/$name" ] && mounts+=("$name")
  done
  for pat in "${DIST_INFO[@]}"; do
    for src in "$host_sp"/$pat-*.dist-info; do [ -d "$src" ] && mounts+=("$(basename "$src")"); done
  done
  # drop stale mount points (e.g. an older numpy's dist-info)
  for src in "$rootfs$sp"/*; do
    [ -e "$src" ] || [ -L "$src" ] || continue
    name="$(basename "$src")"
    [[ " ${mounts[*]} " == *" $name "* ]] || rm -rf "${src:?}"
  done
  local entries="" dst
  for name in "${mounts[@]}"; do
    dst="$rootfs$sp/$name"
    if [ -d "$host_sp/$name" ]; then mkdir -p "$dst"; else [ -e "$dst" ] || : >"$dst"; fi
    entries+="$(printf ',\n    {"destination": %s, "type": "bind", "source": %s, "options": ["rbind", "ro", "nosuid", "nodev"]}' \
      "$(json_str "$sp/$name")" "$(json_str "$(readlink -f "$host_sp/$name")")")"
  done
  for f in "${ETC_FILES[@]}"; do
    [ -e "/etc/$f" ] || continue
    entries+="$(printf ',\n    {"destination": "/etc/%s", "type": "bind", "source": %s, "options": ["bind", "ro", "nosuid", "nodev"]}' \
      "$f" "$(json_str "$(readlink -f "/etc/$f")")")"
  done

  local new; new="$(cat <<EOF
{
  "ociVersion": "1.0.2",
  "process": {
    "terminal": false,
    "user": {"uid": 0, "gid": 0},
    "args": ["/bin/sh", "-c", "echo 'hpc-train-test-image: no command given'; exit 2"],
    "env": [
      "PATH=$IMAGE_ENV/bin:/usr/local/bin:/usr/bin:/bin",
      "HPC_TRAIN_TEST_IMAGE=1",
      "LANG=C.UTF-8"
    ],
    "cwd": "/",
    "capabilities": {
      "bounding": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"],
      "effective": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"],
      "permitted": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
    },
    "noNewPrivileges": true
  },
  "root": {"path": $(json_str "$rootfs"), "readonly": true},
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=4g"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/sys", "type": "bind", "source": "/sys", "options": ["rbind", "ro", "nosuid", "noexec", "nodev"]},
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
    {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]}$entries
  ],
  "linux": {
    "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}],
    "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"],
    "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
  }
}
EOF
)"
  python3 -c 'import json,sys; json.loads(sys.stdin.read())' <<<"$new" || die "generated config.json is not valid JSON"
  if [ "$(cat "$dir/config.json" 2>/dev/null)" != "$new" ]; then
    printf '%s\n' "$new" >"$dir/config.json.tmp" && mv -f "$dir/config.json.tmp" "$dir/config.json"
    log "built $dir (${#mounts[@]} site-packages binds from $host_sp)"
  else
    log "up to date: $dir"
  fi
  chmod 755 "$dir" "$rootfs"; chmod 644 "$dir/config.json"
}

# run the bundle once, outside Slurm (checks the runtime and the bundle)
cmd_check() {
  local dir="${1:-}"; [ -n "$dir" ] || die "usage: $0 check DIR"
  local rt; rt="$(command -v crun || command -v runc || true)"; [ -n "$rt" ] || die "neither crun nor runc installed"
  local tmp; tmp="$(mktemp -d)"
  python3 - "$dir/config.json" "$tmp/config.json" "$dir/rootfs" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["root"]["path"] = sys.argv[3]
c["process"]["args"] = ["python", "-c", "import sys, torch; print(sys.executable, torch.__version__, open('/etc/hpc-train-test-image').read().strip())"]
json.dump(c, open(sys.argv[2], "w"))
PY
  local rc=0
  local opts=()  # crun: no cgroups (hybrid cgroup v1/v2 hosts are refused otherwise)
  [ "${rt##*/}" = crun ] && opts=(--cgroup-manager=disabled)
  "$rt" --root="$tmp/state" "${opts[@]}" run --bundle "$tmp" "hpc-train-image-check-$$" || rc=$?
  rm -rf "$tmp"
  return "$rc"
}

# the runtime wrapper of RUNTIME above
cmd_runtime() {
  local file="${1:-}" state="${2:-}"
  [ -n "$file" ] && [ -n "$state" ] || die "usage: $0 runtime FILE STATE"
  local rt; rt="$(command -v crun || command -v runc || true)"; [ -n "$rt" ] || die "neither crun nor runc installed"
  local opts="--root=$state"
  [ "${rt##*/}" = crun ] && opts="$opts --cgroup-manager=disabled"
  install -d -m 711 "$state"
  # (quoted here-doc: @RT@/@OPTS@ are filled in by sed)
  sed -e "s|@RT@|$rt|" -e "s|@OPTS@|$opts|" >"$file.tmp" <<'EOF'
#!/bin/sh
# Generated by scripts/container_test_image.sh runtime: crun or runc, for launcher=local runs of the test image and
# for the Slurm test cluster's oci.conf (scripts/slurm_test_cluster.sh writes its wrapper through this command)
rt() {
  # crun refuses a hybrid cgroup v1+v2 host whose v2 hierarchy has controllers
  # ("cgroups in hybrid mode not supported"), even with cgroups disabled: run
  # it in a private mount namespace without /sys/fs/cgroup/unified there.
  if [ "${RT##*/}" = crun ] && grep -qs . /sys/fs/cgroup/unified/cgroup.controllers; then
    exec unshare --mount --propagation private /bin/sh -c 'umount -l /sys/fs/cgroup/unified && exec "$@"' sh "$RT" $OPTS "$@"
  fi
  exec "$RT" $OPTS "$@"
}
RT=@RT@ OPTS="@OPTS@"
if [ "${1:-}" = state ]; then
  # Once `run` has returned the runtime has deleted the container and `state`
  # fails with a plain-text error, which Slurm 22.05 logs as "_try_parse: JSON
  # parsing error" (into the job's stderr for batch steps): answer "stopped".
  (rt "$@") 2>/dev/null || printf '{"ociVersion": "1.0.0", "id": "%s", "status": "stopped"}\n' "${2:-}"
  exit 0
fi
rt "$@"
EOF
  chmod 755 "$file.tmp"; mv -f "$file.tmp" "$file"
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  check) shift; cmd_check "$@" ;;
  runtime) shift; cmd_runtime "$@" ;;
  *) echo "usage: $0 {build DIR|check DIR|runtime FILE STATE}" >&2; exit 2 ;;
esac
