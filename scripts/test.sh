#!/usr/bin/env bash
# Install hpc_train into ./.venv and run the whole test suite (the README's test command; .ci/run calls it).
# The Slurm tests start a real local Slurm cluster through scripts/slurm_test_cluster.sh (installs Debian packages; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test]"
exec .venv/bin/python -m pytest "$@"
