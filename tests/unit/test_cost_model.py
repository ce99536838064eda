"""strategy=auto's cost model (hpc_train.launch.planning.cost_model): a rank's counted FLOPs and bytes over the
cluster's rates, plus the pipeline's bubble; the rates from the cluster profile's keys and hpc_train's tables."""

from __future__ import annotations

import pytest

from hpc_train.config.errors import ConfigError
from hpc_train.launch.planning.cost_model import rates_for, step_time

RANK = {"flops": 4e12, "comm": {"all_gather": {"intra": 3e9}, "reduce_scatter": {"inter": 1e9}}, "messages": {}}


def test_compute_over_the_gpus_sustained_peak_plus_each_links_bytes_over_its_bandwidth():
    rates = rates_for({"gpu_type": "h100", "interconnect": {"intra": 300, "inter": "infiniband"}}, "bf16", 0.5, False)
    step = step_time([RANK], rates)
    assert step.compute == pytest.approx(4e12 / (989.4e12 * 0.5))
    assert step.comm == pytest.approx(3e9 / 300e9 + 1e9 / 25e9)
    assert step.bubble == 0 and step.total == pytest.approx(step.compute + step.comm)


def test_the_slowest_rank_and_the_pipelines_idle_share_make_the_step():
    rates = rates_for({"cpu_gflops": 100}, "32", 0.4, True)
    slower = {**RANK, "flops": 8e12}
    step = step_time([RANK, slower], rates, pp=4, chunks=6)
    assert step.compute == pytest.approx(8e12 / 100e9)  # CPU workers: the given rate, no efficiency applied
    # gpipe: (pp - 1) / (chunks + pp - 1) of the step idle, i.e. compute x (pp - 1) / chunks more
    assert step.bubble / (step.compute + step.bubble) == pytest.approx(3 / 9)
    # workers that outnumber the cores: one waiting in the bubble leaves its core to the others
    assert step_time([RANK], rates_for({"cpu_gflops": 100}, "32", 0.4, True, shared_cores=True), 4, 6).bubble == 0


def test_each_collective_pays_its_links_latency_on_top_of_its_bytes():
    cluster = {"interconnect": {"intra": 100, "inter": "ethernet", "intra_latency_us": 5}}
    rates = rates_for(cluster, "bf16", 0.4, False)
    sent = {"flops": 0, "comm": {"all_reduce": {"intra": 1e9, "inter": 3e9}}, "messages": {"intra": 10, "inter": 4}}
    assert step_time([sent], rates).comm == pytest.approx(1e9 / 100e9 + 10 * 5e-6 + 3e9 / 3e9 + 4 * 50e-6)


def test_a_link_the_table_does_not_know_is_refused_naming_its_key():
    with pytest.raises(ConfigError, match=r"cluster\.interconnect\.inter.*nvlink, pcie, infiniband"):
        rates_for({"interconnect": {"inter": "tin cans"}}, "bf16", 0.4, False)
