"""The capacity check's reading of `sinfo` as other sites print it (the test cluster's own `sinfo` is read against
`scontrol show node` in tests/slurm/test_slurm_capacity.py)."""

from __future__ import annotations

import pytest

from hpc_train.config.errors import ConfigError
from hpc_train.launch.planning import capacity


def test_sinfo_formats_of_other_sites():
    """Typed GPUs with socket bindings, several gres, day-long limits: as real sites print them."""
    text = (
        "gpu001|gpu_p13*|80|2:20:2|191000|gpu:v100:4(S:0-1)|20:00:00\n"
        "gpu101|gpu_p5|64|2:32:1|512000|gpu:a100:8(S:0-1),mps:400|2-00:00:00\n"
        "cpu001|cpu|40|2:20:1|190000|(null)|infinite\n"
    )
    found = capacity.parse_sinfo(text)
    assert found["gpu_p13"].default and found["gpu_p13"].max_minutes == 1200
    assert found["gpu_p13"].nodes[0].gpus == 4 and found["gpu_p13"].nodes[0].cores == 40
    assert found["gpu_p5"].nodes[0].gpus == 8 and found["gpu_p5"].max_minutes == 2880
    assert found["cpu"].nodes[0].gpus == 0 and found["cpu"].max_minutes is None
    ok = {
        "nodes": 1,
        "ntasks_per_node": 4,
        "cpus_per_task": 10,
        "gres": "gpu:4",
        "time": 600,
        "additional_parameters": {"hint": "nomultithread"},
    }
    capacity.check_capacity(ok, "resources.time", found)  # 40 cores: fits
    with pytest.raises(ConfigError) as err:
        capacity.check_capacity({**ok, "cpus_per_task": 20}, "resources.time", found)
    assert "`cluster.cpus_per_gpu`" in str(err.value) and "cluster.cpus_per_gpu=10" in str(err.value)
