#!/usr/bin/env bash
# Install hpc_train into ./.venv and run the whole test suite (the README's test command; .ci/run calls it).
# The Slurm tests start a real local Slurm cluster through scripts/slurm_test_cluster.sh (installs Debian packages; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test]"
# Serial. `-n 2 --dist loadgroup` (pytest-xdist; groups in tests/conftest.py) ran the suite in 38 min instead of ~48
# but failed test_a_sweep_bigger_than_max_array_size_goes_in_as_throttled_arrays (MaxSubmitJobs of 5 seen): not yet
# understood, so not the default.
exec .venv/bin/python -m pytest "$@"
