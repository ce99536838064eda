"""`single`: one process, one device."""

from hpc_train.compute.parallel.base import Strategy


class SingleStrategy(Strategy):
    name = "single"
