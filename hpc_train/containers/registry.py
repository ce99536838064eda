"""The one place a runtime's name picks its code (``container.name``, set by ``container=NAME``)."""

from __future__ import annotations

from typing import Dict, Optional

from hpc_train.containers.apptainer import Apptainer
from hpc_train.containers.base import ContainerRuntime
from hpc_train.containers.oci import Oci
from hpc_train.containers.pyxis import Pyxis
from hpc_train.containers.settings import ContainerSettings

# One per option of the container group but none (tests/unit/test_containers.py holds them equal).
RUNTIMES: Dict[str, ContainerRuntime] = {runtime.name: runtime for runtime in (Apptainer(), Pyxis(), Oci())}


def runtime_for(settings: ContainerSettings) -> Optional[ContainerRuntime]:
    """The runtime the settings name; None for no container."""
    return RUNTIMES.get(settings.name) if settings.enabled else None
