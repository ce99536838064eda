"""The `hpc-train-connect` command: open (or check, or close) the one SSH connection to a cluster that a laptop's
later commands, the Python API and notebooks reuse; in a terminal, so a password or a second factor is asked once.

    hpc-train-connect cluster=mysite             # the profile's cluster.login (any overrides of hpc-train)
    hpc-train-connect me@login.cluster.org        # or a destination as ssh takes it
    hpc-train-connect cluster=mysite --check      # is it open? (exit 0 / 1)
    hpc-train-connect cluster=mysite --close
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from hpc_train.config.errors import ConfigError
from hpc_train.errors import Unreachable
from hpc_train.hosts.ssh import SshTarget
from hpc_train.launch.hydra import exits
from hpc_train.remote.connection import Connection
from hpc_train.remote.settings import CONNECT_COMMAND, RemoteSettings

DEFAULT_HOURS = 12.0  # a working day: the connection closes itself after this long without a command
WINDOWS_WORDS = (
    "Windows' OpenSSH has no control sockets, so no connection can be shared: each command logs in again (a"
    " two-factor site asks every time). Use WSL, where Linux's OpenSSH shares one."
)


def _settings(words: List[str], config_dir: Optional[str]) -> RemoteSettings:
    if len(words) == 1 and "=" not in words[0]:
        return RemoteSettings(login=words[0])
    # Hydra's compose: only to read the profile's cluster.login (and its setup lines, its Python)
    from hpc_train import api

    settings = RemoteSettings.of(api.compose(words, config_dir=config_dir))
    if not settings.enabled:
        raise ConfigError(
            "cluster.login",
            "these overrides name no cluster to connect to (cluster.login is null).",
            "give the profile that sets it (cluster=mysite) or cluster.login=me@login.cluster.org.",
        )
    return settings


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=CONNECT_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="+", help="hpc-train overrides naming the cluster, or an SSH destination")
    parser.add_argument("--config-dir", "-cd", default=None, help="your config dir, as hpc-train's --config-dir")
    parser.add_argument("--check", action="store_true", help="say whether the connection is open (exit 0) or not (1)")
    parser.add_argument("--close", action="store_true", help="close the connection")
    parser.add_argument("--hours", type=float, default=DEFAULT_HOURS, help="how long it stays open while unused")
    args = parser.parse_args(argv)
    try:
        settings = _settings(args.words, args.config_dir)
        target = SshTarget(str(settings.login))
        if os.name == "nt":
            print(f"{CONNECT_COMMAND}: {WINDOWS_WORDS}", file=sys.stderr)
        if args.check or args.close:
            alive = target.master_alive()
            if args.close and alive:
                target.close_master()
            state = ("closed" if args.close else "open") if alive else "not open"
            print(f"{CONNECT_COMMAND}: the connection to {settings.login} is {state}")
            return 0 if alive or args.close else 1
        conn = Connection(settings)
        conn.host.open(interactive=sys.stdin.isatty(), persist=f"{int(args.hours * 60)}m")
        cluster = conn.open()
    except (ConfigError, Unreachable) as err:  # the hpc-train command's message and exit code (5: unreachable)
        print(exits.one_message(err), file=sys.stderr)
        return exits.exit_code(err)
    print(
        f"{CONNECT_COMMAND}: connected to {settings.login} (hpc_train {cluster.version} on both sides, {cluster.python}"
        f" there); it stays open {args.hours:g} h after its last use. Close it: {CONNECT_COMMAND}"
        f"{' --config-dir ' + args.config_dir if args.config_dir else ''} {' '.join(args.words)} --close"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
