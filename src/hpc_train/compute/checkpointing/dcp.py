"""The old module name of the sharded (DCP) format, kept because a caller outside this package still reads fsdp
checkpoints through it (tests/test_stop_during_checkpoint.py); new code imports from the dcp_*.py modules.
"""

from hpc_train.compute.checkpointing.dcp_dirs import step_dir
from hpc_train.compute.checkpointing.dcp_load import read_loop
from hpc_train.compute.checkpointing.dcp_manifest import verify

__all__ = ["read_loop", "step_dir", "verify"]
