"""Writes the environment it was started with to ``$HPC_TRAIN_RUN_DIR/env/<host>_<pid>.json`` and exits.

The tests read it back to check, key by key, what each layout gives a user's script.
"""

import json
import os
import socket
from pathlib import Path

folder = Path(os.environ["HPC_TRAIN_RUN_DIR"]) / "env"
folder.mkdir(exist_ok=True)
(folder / f"{socket.gethostname()}_{os.getpid()}.json").write_text(json.dumps(dict(os.environ)))
print("environment written", flush=True)
