"""ConfigError: bad input found before anything runs, raised by the declarations' engine and the launch side.

Declared in ``hpc_train.errors`` with the other families of ``HpcTrainError``; importable here as it always was.
"""

from __future__ import annotations

from hpc_train.errors import ConfigError

__all__ = ["ConfigError"]
