#!/usr/bin/env bash
# =============================================================================
# browser_test_tool.sh - the headless browser of the browser tests (Debian's
# chromium package), for tests/e2e/test_dashboard.py: optuna-dashboard's page
# of an adaptive sweep's study, rendered by a real browser.
# =============================================================================
#
# USAGE
#   scripts/browser_test_tool.sh install  # install chromium if missing (root)
#   scripts/browser_test_tool.sh path     # print the browser's path; exit 1
#                                         # when it is not installed
#
# `install` runs apt-get update and apt-get install -y --no-install-recommends
# chromium (log: /tmp/hpc-train-browser-apt.log), and nothing when chromium is
# already there. scripts/test.sh runs it in the background, beside the Slurm
# test cluster's and the SSH test server's installs, while pip installs.
# Tested on Debian 12 (chromium 156) in a container without systemd.
# =============================================================================
set -euo pipefail

APT_LOG=/tmp/hpc-train-browser-apt.log
# the names Debian's package installs (chromium) and those of other builds
BROWSERS=(chromium chromium-browser google-chrome)

log() { printf '[browser-test-tool] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

browser_path() {
  local b
  for b in "${BROWSERS[@]}"; do
    if command -v "$b" >/dev/null; then command -v "$b"; return 0; fi
  done
  return 1
}

cmd_install() {
  browser_path >/dev/null && return 0
  [ "$(id -u)" -eq 0 ] || die "chromium is missing and installing it needs root (apt-get install chromium)"
  local t0=$SECONDS
  log "installing chromium (log: $APT_LOG)"
  export DEBIAN_FRONTEND=noninteractive
  # another apt-get (the other test infrastructure's, a user's) may hold dpkg's lock: wait for it
  if ! apt-get -o DPkg::Lock::Timeout=300 update -qq >"$APT_LOG" 2>&1; then
    tail -n 30 "$APT_LOG" >&2; die "apt-get update failed (log: $APT_LOG)"
  fi
  if ! apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium >>"$APT_LOG" 2>&1; then
    tail -n 30 "$APT_LOG" >&2; die "apt-get install chromium failed (log: $APT_LOG)"
  fi
  browser_path >/dev/null || die "the chromium package is installed but no chromium command is on PATH"
  log "chromium installed in $((SECONDS - t0)) s: $(browser_path)"
}

case "${1:-}" in
  install) cmd_install ;;
  path) browser_path ;;
  *) echo "usage: $0 {install|path}" >&2; exit 2 ;;
esac
