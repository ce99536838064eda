#!/usr/bin/env bash
# Install hpc_train into ./.venv and run the whole test suite (the README's test command; .ci/run calls it).
# The Slurm tests start a real local Slurm cluster through scripts/slurm_test_cluster.sh (installs Debian packages; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test]"
# Two pytest-xdist workers: the Slurm tests (one group, one worker, one job at a time on the cluster as in a serial
# run) wait on the cluster while the other worker runs the CPU tests; each other test file is a group of its own
# (tests/conftest.py, _xdist_group).
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
