"""A researcher's own package: a model that is not a ResNet and a dataset hpc_train has never seen.

Nothing here imports hpc_train: the config in ../my_conf names these classes with _target_.
"""

from mynet.data import Blobs, Regression
from mynet.model import TinyNet

__all__ = ["Blobs", "Regression", "TinyNet"]
