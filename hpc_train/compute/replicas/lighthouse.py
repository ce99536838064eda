"""The lighthouse of a run made of replica groups: torchft's quorum server, started and stopped by hpc_train.

``python -m hpc_train.compute.replicas.lighthouse --port P --min-replicas M --timeout-s T --heartbeat-timeout-s H``
serves on every interface at port P until SIGTERM. A group is dropped from the quorum when it has not heartbeated
for H seconds (its processes or its node died: torchft's native thread heartbeats every 0.1 s, through any pause of
Python) or has not asked for a quorum 2 x T seconds after the others (it hangs: a group that is only late, by a
collective that failed after T seconds, must still make the next quorum, or the groups would keep missing each other
by a hair). The launchers
start it: the local launcher beside the ranks, a Slurm job's batch-host agent on the batch host (see the
architecture page: when its host dies, the whole job is requeued as without replica groups).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from hpc_train.processes.signal_relay import handling

QUORUM_TICK_MS = 100  # how often the lighthouse looks for a quorum
JOIN_FACTOR = 2  # a heartbeating group that has not asked for the quorum is left out after JOIN_FACTOR x timeout_s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--heartbeat-timeout-s", type=float, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("RUST_LOG", "warn")  # the lighthouse logs every quorum tick at its default, info
    from torchft._torchft import LighthouseServer  # the compiled lighthouse (imports torch through torchft)

    timeout_ms = max(1, int(args.timeout_s * 1000))
    server = LighthouseServer(
        bind=f"[::]:{args.port}",
        min_replicas=args.min_replicas,
        # A group late by a failed collective (timeout_s at most) still makes the next quorum: twice as long
        join_timeout_ms=JOIN_FACTOR * timeout_ms,
        quorum_tick_ms=QUORUM_TICK_MS,
        heartbeat_timeout_ms=max(1, int(args.heartbeat_timeout_s * 1000)),
    )
    print(
        f"hpc-train: lighthouse {server.address()} (min {args.min_replicas} groups, timeout {args.timeout_s:g} s,"
        f" heartbeat timeout {args.heartbeat_timeout_s:g} s)",
        file=sys.stderr,
        flush=True,
    )
    stopped = threading.Event()
    with handling((signal.SIGTERM, signal.SIGINT), lambda *_: stopped.set()):
        stopped.wait()
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
