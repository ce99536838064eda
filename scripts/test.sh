#!/usr/bin/env bash
# Install hpc_train into ./.venv and run the whole test suite (the README's test command; .ci/run calls it).
# The Slurm tests start a real local Slurm cluster through scripts/slurm_test_cluster.sh (installs Debian packages; needs root).
# Both paths check the code with ruff (lint and formatting) right after the install, before pytest.
# --fast: the same install and ruff checks, then only the unit tier (tests/unit: no process started, no Slurm cluster).
# Every other argument goes to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=false
args=()
for arg in "$@"; do
    if [[ $arg == --fast ]]; then fast=true; else args+=("$arg"); fi
done
packages=""
if ! $fast && [[ $(id -u) == 0 ]] && [[ ${#args[@]} == 0 || " ${args[*]} " == *slurm* || " ${args[*]} " == *" -m "* ]]; then
    # The whole suite (or its Slurm tests): the Debian packages of the test infrastructure (the Slurm test cluster's,
    # crun, the SSH test server's openssh-server, the browser tests' chromium) install while pip installs (both mostly
    # wait on downloads), not inside pytest's time, one apt-get after the other. Their logs:
    # /tmp/hpc-train-slurm-apt.log, /tmp/hpc-train-ssh-apt.log, /tmp/hpc-train-browser-apt.log.
    {
        failed=0
        { bash scripts/slurm_test_cluster.sh install && bash scripts/ssh_test_server.sh install; } || failed=1
        bash scripts/browser_test_tool.sh install || failed=1
        exit "$failed"
    } &
    packages=$!
fi
python3 -m venv .venv
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test]"
# Hydra's Optuna sweeper declares optuna<3 but runs on the Optuna the project needs (the tune extra); the suite
# drives it as users' Hydra apps do, so it installs without its dependency pins.
.venv/bin/python -m pip install --quiet --no-deps -c constraints.txt hydra-optuna-sweeper==1.3.0
# The linter before any test (so CI fails on it too): ruff's settings are in pyproject.toml, its version in constraints.txt.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [[ -n $packages ]]; then
    if ! wait "$packages"; then
        echo "scripts/test.sh: the test infrastructure's packages did not install; the Slurm and browser tests will say why" >&2
    fi
    # Then the Slurm test cluster and the SSH test server start, before pytest rather than in the first test that
    # needs them (the Slurm tests run one after the other: their start-up would lengthen the longest group).
    .venv/bin/python -m tests.support.infrastructure || true
fi
if $fast; then
    # No test of this tier shares anything with another (no cluster, no group): each test goes to the free worker.
    exec .venv/bin/python -m pytest -n 2 --dist load tests/unit ${args[@]+"${args[@]}"}
fi
# Two pytest-xdist workers: the Slurm tests (one group, one worker, one job at a time on the cluster as in a serial
# run) wait on the cluster while the other worker runs the CPU tests; each other test file is a group of its own
# (tests/conftest.py, _xdist_group). The groups go in the order the conftest gives them (the Slurm group first, the unit
# files last: _longest_first), not xdist's order by test count.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder ${args[@]+"${args[@]}"}
