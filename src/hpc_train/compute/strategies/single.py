"""`single`: one process, one device."""

from hpc_train.compute.strategies.base import Strategy


class SingleStrategy(Strategy):
    name = "single"
