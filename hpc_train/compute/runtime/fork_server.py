"""``python -m hpc_train.compute.runtime.fork_server SOCKET``: ranks started warm, a test facility.

The server imports torch and the modules every training rank imports, once, then waits on a Unix socket. The
local launcher (with ``HPC_TRAIN_FORK_SERVER`` set, hpc_train.processes.warm_ranks) asks it for each rank; the
server forks and the child becomes the rank as a fresh ``python -m MODULE ARGS`` would be:

* its file descriptors: the rank's stdin, stdout and stderr and any passed on, at the same numbers; the server's
  own sockets closed; what the imports opened kept (a fresh process opens the same);
* its folder, umask, environment (``os.environ`` replaced before anything reads it, with what the imports set in
  it, as they set it in a fresh rank), ``sys.argv`` and
  ``sys.path[0]``, ``sys.std*`` rebuilt as Python builds them (``PYTHONUNBUFFERED``, a terminal or not);
* its signals: every disposition back to the default, then what a fresh Python has (the launcher's ignored
  signals, SIGPIPE and SIGXFSZ ignored, SIGINT raising KeyboardInterrupt) and the launcher's mask;
* its random state: torch's default generator and numpy's global one seeded afresh from the operating system,
  as at their import (Python's ``random`` reseeds itself after a fork);
* its threads: the server runs none (checked before each fork: a library's thread pool would not survive it);
  torch's intra-op threads and the BLAS pools set from the rank's ``OMP_NUM_THREADS``.

The server says no (the launcher then starts a fresh process) to a request it cannot serve that way: another
Python, a command other than ``-m MODULE``, an environment that differs from its own in a variable not known to
be read only at run time (anything read when torch or a library loads: ``TORCH*``, ``PYTHON*``, ``CUDA_*``,
``LD_*``, locales...), a descriptor number its imports hold, a thread running in the server.

What stays different: the rank's parent (this server), its process group and session, ``/proc/<pid>/cmdline``,
Python's hash seed (shared by every warm rank) and warnings already printed by the imports. The server ends
when it gets SIGTERM or its parent ends, killing the ranks still running; a rank whose launcher's connection
closes is killed too.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback
from typing import Dict, List, Optional

from hpc_train.processes.rank_env import TORCHRUN_VARIABLES
from hpc_train.processes.signal_relay import handling
from hpc_train.processes.warm_ranks import DECLINED, EXIT, MAX_FDS, PID, SIGNAL, START, STATS, send

# What every training rank imports (hpc_train.compute.worker and what entry/train.py imports for a run); a rank
# imports the rest (the user's code, a strategy's modules) itself, after the fork.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",  # imported by a rank's first torch.optim optimizer (torch's _disable_dynamo wrappers)
    "numpy",
    "hpc_train.compute.worker",
    "hpc_train.compute.checkpointing.checkpointer",
    "hpc_train.compute.data.loaders",
    "hpc_train.compute.parallel",
    "hpc_train.compute.runtime.distributed",
    "hpc_train.compute.runtime.heartbeat",
    "hpc_train.compute.training.loggers",
    "hpc_train.compute.training.optim",
    "hpc_train.compute.training.settings",
    "hpc_train.compute.training.trainer",
)
# Variables that may differ between the server and a rank: read by the rank at run time, or applied after the fork.
RUN_TIME_PREFIXES = ("HPC_TRAIN_", "PYTEST_", "HYDRA_")
APPLIED_AFTER_FORK = ("OMP_NUM_THREADS", "PYTHONUNBUFFERED", "PWD", "OLDPWD", "_")  # the last three: a shell's notes
FRESH_IGNORED = (signal.SIGPIPE, signal.SIGXFSZ)  # what Python ignores at start-up
HIGH_FD = 512


def _open_fds() -> List[int]:
    """This process's open descriptors (not the one listing them, closed by the time it is checked)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        found.append(int(name))
    return sorted(found)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


class ForkServer:
    """One listening socket; per rank one connection, its pid, its exit status."""

    def __init__(self, path: str) -> None:
        self.env = dict(os.environ)  # what a rank's environment must agree with, as it was before the imports
        for name in PRELOAD:
            importlib.import_module(name)
        self.set_by_imports = {k: v for k, v in os.environ.items() if self.env.get(k) != v}  # TORCHINDUCTOR_CACHE_DIR
        self.imported_fds = set(_open_fds())  # what the imports hold: a fresh rank's imports hold the same
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(128)
        self.wake_r, self.wake_w = socket.socketpair()
        for end in (self.wake_r, self.wake_w):
            end.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.ranks: Dict[int, socket.socket] = {}  # pid -> its launcher's connection
        self.forks, self.declined = 0, []  # type: int, List[str]
        self.stopping = False
        self.parent = os.getppid()

    # -- the loop -------------------------------------------------------------------------------------------------
    def serve(self) -> int:
        signal.set_wakeup_fd(self.wake_w.fileno())  # SIGCHLD (a no-op handler) wakes the loop when a rank ends
        with handling([signal.SIGCHLD], lambda *_: None), handling([signal.SIGTERM], self._stop):
            while not self.stopping and os.getppid() == self.parent:
                for key, _ in self.selector.select(timeout=1.0):
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj is self.wake_r:
                        self._drain_wakeups()
                    else:
                        self._from_launcher(key.fileobj)  # type: ignore[arg-type]
                self._reap()
            for pid in list(self.ranks):
                _kill(pid, signal.SIGKILL)
        return 0

    def _stop(self, *_: object) -> None:
        self.stopping = True

    def _drain_wakeups(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while self.ranks:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.ranks.pop(pid, None)
            if conn is not None:
                _answer(conn, {EXIT: os.waitstatus_to_exitcode(status)})
                try:
                    self.selector.unregister(conn)
                except KeyError:
                    pass  # unregistered when its launcher went
                conn.close()

    def _from_launcher(self, conn: socket.socket) -> None:
        pid = next((p for p, c in self.ranks.items() if c is conn), None)
        data = _recv(conn)
        if not data:  # the launcher is gone: its rank does not outlive it here
            self.selector.unregister(conn)
            if pid is not None:
                _kill(pid, signal.SIGKILL)
            return
        for line in data.splitlines():
            message = json.loads(line)
            if pid is not None and SIGNAL in message:
                _kill(pid, int(message[SIGNAL]))

    # -- one request ----------------------------------------------------------------------------------------------
    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10.0)
        fds: List[int] = []
        try:
            request, fds = _read_request(conn)
            if STATS in request:
                _answer(conn, {"forks": self.forks, DECLINED: self.declined})
            else:
                self._start(conn, request, fds)
                return
        except (OSError, ValueError) as error:
            self.declined.append(f"unreadable request: {error}")
        finally:
            for fd in fds:
                os.close(fd)
        conn.close()

    def _start(self, conn: socket.socket, request: Dict, fds: List[int]) -> None:
        why = self._refusal(request)
        if why:
            self.declined.append(why)
            _answer(conn, {DECLINED: why})
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # the child's until it sets its own
        pid = os.fork()
        if pid == 0:
            self._become_rank(request, fds)  # never returns
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.forks += 1
        self.ranks[pid] = conn
        conn.setblocking(True)
        _answer(conn, {PID: pid})
        self.selector.register(conn, selectors.EVENT_READ)

    def _refusal(self, request: Dict) -> str:
        """Why this request cannot be served as a fresh process would run it ("": it can)."""
        argv = request[START]
        if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
            return f"not {sys.executable} -m MODULE: {argv[:3]}"
        env = request["env"]
        differing = sorted(k for k in set(env) | set(self.env) if not self._agrees(k, env.get(k)) and not _run_time(k))
        if differing:
            return f"variables read at start-up differ from the server's: {', '.join(differing)}"
        if not env.get("OMP_NUM_THREADS", "").isdigit() or int(env["OMP_NUM_THREADS"]) < 1:
            return f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS')!r} is no count of threads"
        taken = sorted(set(request["fds"]) & self.imported_fds - {0, 1, 2})
        if taken:
            return f"descriptors {taken} are held by the server's imports"
        if _threads() != 1:
            return f"{_threads()} threads run in the server (a fork keeps only one)"
        return ""

    def _agrees(self, name: str, value: Optional[str]) -> bool:
        """A rank's variable as the server started, or already what the server's imports set it to (a launcher that
        imported torch itself passes TORCHINDUCTOR_CACHE_DIR on: a fresh rank's imports keep that value)."""
        return value == self.env.get(name) or (name in self.set_by_imports and value == self.set_by_imports[name])

    # -- the child ------------------------------------------------------------------------------------------------
    def _become_rank(self, request: Dict, fds: List[int]) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            _reset_signals(request["ignored"], request["blocked"])
            self._close_server()
            _place_fds(fds, request["fds"], self.imported_fds)
            os.chdir(request["cwd"])
            os.umask(int(request["umask"]))
            os.environ.clear()
            os.environ.update(request["env"])
            for name, value in self.set_by_imports.items():  # as the same imports in a fresh rank set them
                os.environ.setdefault(name, value)
            _rebuild_stdio(bool(os.environ.get("PYTHONUNBUFFERED")))
            self._fresh_state(int(os.environ["OMP_NUM_THREADS"]))
            code = _run_module(request[START][2], request[START][3:])
        except BaseException:  # noqa: BLE001  # the child never returns into the server's loop
            traceback.print_exc()
        _exit(code)

    def _close_server(self) -> None:
        self.selector.close()
        for sock in (self.listener, self.wake_r, self.wake_w, *self.ranks.values()):
            sock.close()

    def _fresh_state(self, threads: int) -> None:
        # numpy and torch: loaded by PRELOAD, after the server read its environment (their imports set variables in it)
        import numpy
        import torch

        torch.seed()  # a fresh torch seeds its default generator from the OS, as numpy its global one
        numpy.random.seed()
        torch.set_num_threads(threads)
        _blas_threads(self.env, os.environ)


def _run_time(name: str) -> bool:
    return name in TORCHRUN_VARIABLES or name in APPLIED_AFTER_FORK or name.startswith(RUN_TIME_PREFIXES)


def _read_request(conn: socket.socket):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, MAX_FDS)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ValueError("the request ended early")
        data += more
    return json.loads(data), list(fds)


def _recv(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except OSError:
        return b""


def _answer(conn: socket.socket, message: Dict) -> None:
    try:
        send(conn, message)
    except OSError:
        pass  # the launcher is gone


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _reset_signals(ignored: List[int], blocked: List[int]) -> None:
    """Dispositions as after exec from the launcher, then Python's start-up: handlers back to the default, what the
    launcher ignores still ignored, SIGPIPE and SIGXFSZ ignored, SIGINT raising KeyboardInterrupt."""
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(signum, signal.SIG_IGN if signum in ignored else signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # signals Python may not touch (the real-time ones glibc keeps)
    for signum in FRESH_IGNORED:
        signal.signal(signum, signal.SIG_IGN)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _place_fds(received: List[int], targets: List[int], imported: set) -> None:
    """The received descriptors at their numbers (0, 1, 2, passed ones); every other one the imports did not open
    closed, as a fresh process started with close_fds has none."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, HIGH_FD) for fd in received]  # above every number a target may have
    keep = set(targets) | imported | set(high)
    for fd in received:
        if fd not in keep:
            os.close(fd)
    for fd in _open_fds():
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for fd, target in zip(high, targets):
        os.dup2(fd, target, inheritable=True)
    for fd in high:
        if fd not in targets:
            os.close(fd)


def _rebuild_stdio(unbuffered: bool) -> None:
    """sys.stdin, stdout and stderr over descriptors 0, 1 and 2, as Python's start-up makes them."""
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    stdin = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding=encoding, errors=sys.stdin.errors)
    sys.stdin = sys.__stdin__ = stdin  # type: ignore[misc]
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
        tty = os.isatty(fd)
        stream = io.TextIOWrapper(
            raw,  # type: ignore[arg-type]
            encoding=encoding,
            errors="backslashreplace" if fd == 2 else errors,
            line_buffering=(tty or fd == 2) and not unbuffered,
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _blas_threads(server_env: Dict[str, str], env) -> None:
    """The BLAS libraries' thread pools (numpy's OpenBLAS) sized as a fresh process sizes them at load."""

    def wanted(e) -> Optional[str]:
        return e.get("OPENBLAS_NUM_THREADS") or e.get("GOTO_NUM_THREADS") or e.get("OMP_NUM_THREADS")

    if wanted(env) == wanted(server_env):
        return
    # threadpoolctl (scikit-learn's dependency): only where a rank's BLAS threads differ from the server's
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=int(wanted(env) or os.cpu_count() or 1), user_api="blas")


def _run_module(module: str, args: List[str]) -> int:
    """``python -m MODULE ARGS`` in this process: its exit status, after what Python does at exit."""
    sys.argv = [module, *args]  # runpy puts the module's file first, as -m does
    sys.path[0] = os.getcwd()
    _forget(module)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return int(stop.code or 0)
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Python prints it, then ends by SIGINT
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        return 1


def _forget(module: str) -> None:
    """The module as a fresh ``-m`` finds it: not imported yet (the server preloaded it), so it runs as __main__
    alone."""
    sys.modules.pop(module, None)
    package, _, name = module.rpartition(".")
    if package in sys.modules and hasattr(sys.modules[package], name):
        delattr(sys.modules[package], name)


def _exit(code: int) -> None:
    """What Python does at exit before finalizing, then leave (a finished rank skips finalization:
    hpc_train.compute.worker.exit_now); a negative code: killed by that signal, as after a KeyboardInterrupt."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
            os.kill(os.getpid(), -code)
    finally:
        os._exit(code if code >= 0 else 128 - code)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hpc_train.compute.runtime.fork_server SOCKET", file=sys.stderr)
        return 2
    return ForkServer(argv[0]).serve()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without finalizing torch: the server has nothing to save
