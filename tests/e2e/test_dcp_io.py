"""Sharded (DCP) checkpoints of hpc_train.compute.checkpointing.dcp_*.py and the hpc-train-export command.

Real processes on the CPU (gloo), an FSDP2 model (``fully_shard``) and AdamW: atomic saves with
rotation, loads at the same and at other world sizes (resharding), consolidation on one process,
forged and truncated checkpoints refused without running anything, kill -9 mid-save, and a full
disk (a small tmpfs).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn as nn

from hpc_train.compute.checkpointing import dcp_manifest, dcp_save
from hpc_train.compute.checkpointing.dcp_consolidate import consolidate, model_entries
from hpc_train.compute.checkpointing.dcp_dirs import checkpoint_bytes, list_dcp_checkpoints, newest_complete
from hpc_train.compute.checkpointing.dcp_load import SafeFileSystemReader, load_dcp, read_loop
from hpc_train.compute.checkpointing.dcp_manifest import is_complete, verify, write_manifest
from hpc_train.compute.checkpointing.dcp_metadata import read_metadata
from hpc_train.compute.checkpointing.dcp_save import save_dcp, tensor_bytes
from hpc_train.compute.checkpointing.files import (
    CheckpointError,
    DiskFull,
    IncompleteCheckpoint,
    UnsafeCheckpoint,
    capture_rng,
)
from hpc_train.compute.worker import exit_now
from hpc_train.records import rundir
from tests.support.paths import REPO

STEP1, STEP2 = "step_000000001", "step_000000002"


# -- what the spawned ranks run ------------------------------------------------------------------
def _init(rank: int, world: int, port: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


def _done() -> None:
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


def _model(mesh: Any, seed: int, lr: float = 0.01) -> Any:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 3))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def _train_step(model: nn.Module, optim: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(100 + seed)
    model(torch.randn(8, 6)).pow(2).mean().backward()
    optim.step()
    optim.zero_grad()


def _state(model: nn.Module, optim: torch.optim.Optimizer) -> Dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd}


def _full(model: nn.Module, optim: torch.optim.Optimizer) -> Dict[str, Any]:
    """Every parameter and optimizer tensor, unsharded (a collective), and the learning rate."""
    from torch.distributed.tensor import DTensor

    def whole(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if isinstance(t, DTensor) else t

    state = _state(model, optim)
    optim_full = {f"{p}.{k}": whole(v) for p, s in state["optim"]["state"].items() for k, v in s.items()}
    return {
        "model": {k: whole(v) for k, v in state["model"].items()},
        "optim": optim_full,
        "lr": optim.param_groups[0]["lr"],
    }


def _agree(failed: bool) -> bool:
    flag = torch.tensor([int(failed)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _gather(obj: Any) -> Optional[List[Any]]:
    found = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, found, dst=0)
    return found


def _save(state: Dict[str, Any], folder: Path, step: int, keep: int = 1, **extra: Any) -> Path:
    loop = {"state": {"global_step": step}, "rng": [capture_rng()], "fingerprint": {"model": "tiny"}, **extra}
    return save_dcp(state, folder, step, loop, keep, dist.get_rank() == 0, dist.barrier, _agree, _gather)


def _record_hashing() -> List[str]:
    """From now on, the names of the files this process hashes (appended to the list returned)."""
    hashed: List[str] = []
    original = dcp_manifest._sha256

    def recording(path: Path) -> str:
        hashed.append(Path(path).name)
        return original(path)

    dcp_manifest._sha256 = recording
    return hashed


def _assert_same(found: Dict[str, Any], ref: Dict[str, Any]) -> None:
    assert found["model"].keys() == ref["model"].keys()
    assert found["optim"].keys() == ref["optim"].keys()
    for part in ("model", "optim"):
        for key in ref[part]:
            assert torch.equal(found[part][key], ref[part][key]), f"{part} {key} differs after loading"
    assert found["lr"] == ref["lr"]


def _load_into_fresh(mesh: Any, path: Path) -> Dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model, optim = _model(mesh, seed=1, lr=0.5)  # other weights and lr: everything must come from the checkpoint
    state = _state(model, optim)
    load_dcp(state, path)
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return _full(model, optim)


def save_worker(rank: int, world: int, port: int, run_dir: str) -> None:
    """Train, save steps 1 and 2 with keep=1, then load step 2 into a fresh model at the same world size."""
    mesh = _init(rank, world, port)
    folder = Path(run_dir) / "checkpoints"
    model, optim = _model(mesh, seed=0)
    _train_step(model, optim, 0)
    first = _save(_state(model, optim), folder, 1)
    assert first.name == STEP1
    _train_step(model, optim, 1)
    state = _state(model, optim)
    full = _full(model, optim)
    assert tensor_bytes(state["model"]) == sum(t.numel() * 4 for t in full["model"].values())  # global sizes
    hashed = _record_hashing()
    path = _save(state, folder, 2)
    at_save, hashed[:] = list(hashed), []
    if rank == 0:
        torch.save(full, Path(run_dir) / "reference.pt")
    _assert_same(_load_into_fresh(mesh, path), full)
    (Path(run_dir) / f"hashed.{rank}.json").write_text(json.dumps({"save": at_save, "load": hashed}))
    _done()


def load_worker(rank: int, world: int, port: int, run_dir: str) -> None:
    """Load step 2 at another world size (DCP reshards) and compare with what was saved."""
    mesh = _init(rank, world, port)
    found = _load_into_fresh(mesh, Path(run_dir) / "checkpoints" / STEP2)
    _assert_same(found, torch.load(Path(run_dir) / "reference.pt", weights_only=True))
    _done()


def corrupt_load_worker(rank: int, world: int, port: int, paths: List[str], report: str) -> None:
    """Load each damaged checkpoint (deep verification spread over the ranks); note the error and what was hashed."""
    _init(rank, world, port)
    found = []
    for path in paths:
        hashed = _record_hashing()
        try:
            load_dcp({}, Path(path))  # the verification fails before anything is loaded
            found.append({"error": None, "hashed": hashed})
        except CheckpointError as err:
            found.append({"error": type(err).__name__, "message": str(err), "hashed": hashed})
    Path(report).with_suffix(f".{rank}.json").write_text(json.dumps(found))
    _done()


def disk_full_worker(rank: int, world: int, port: int, folder: str, report: str) -> None:
    """A small step 1 fits; step 2 (a big loop.pt on rank 0 only) and step 3 (a big sharded tensor) do not."""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = _init(rank, world, port)
    folder_path = Path(folder)
    model, optim = _model(mesh, seed=0)
    _train_step(model, optim, 0)
    _save(_state(model, optim), folder_path, 1, keep=2)
    messages = {}
    try:  # only rank 0 writes loop.pt: rank 1 must learn of the failure, not wait for ever
        _save(_state(model, optim), folder_path, 2, keep=2, big=torch.zeros(160 * 1024))
    except DiskFull as err:
        messages["loop"] = str(err)
    big = distribute_tensor(torch.zeros(2, 80 * 1024), mesh, [Shard(0)])
    try:  # every rank writes its half inside dcp.save
        _save({**_state(model, optim), "big": big}, folder_path, 3, keep=2)
    except DiskFull as err:
        messages["shards"] = str(err)
    Path(report).with_suffix(f".{rank}.json").write_text(json.dumps(messages))
    _done()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _leave_after(rank: int, fn: Callable[..., None], *args: Any) -> None:
    """`fn(rank, *args)`, then leave as hpc_train's ranks do, without the interpreter's finalization: a worker's
    FSDP2 modules hold its device mesh and process groups in reference cycles, and finalization tearing down their
    gloo threads in no particular order can abort a rank that succeeded ("terminate called without an active
    exception", SIGABRT). A failing `fn` raises as before, and its traceback reaches the test."""
    fn(rank, *args)
    exit_now(0)


def _spawn(fn: Callable[..., None], world: int, *args: Any, timeout: float = 90) -> None:
    """Run `fn(rank, world, port, *args)` on `world` processes; a failing rank fails the test with its traceback."""
    context = mp.start_processes(
        _leave_after, args=(fn, world, _free_port(), *args), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{fn.__name__} at {world} ranks did not finish in {timeout} s (a deadlock?)")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir whose checkpoints/ holds step 2 of a 2-rank FSDP2 run (saved with keep=1), and reference.pt."""
    run = tmp_path_factory.mktemp("run")
    _spawn(save_worker, 2, str(run))
    return run


@pytest.fixture(scope="module")
def reference(run_dir: Path) -> Dict[str, Any]:
    return torch.load(run_dir / "reference.pt", weights_only=True)


@pytest.fixture
def copy(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the step 2 checkpoint dir, free to damage."""
    return Path(shutil.copytree(run_dir / "checkpoints" / STEP2, tmp_path / "checkpoints" / STEP2))


class _RunsCommand:
    """Unpickled, it calls os.system (what a forged checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


class _CallsDcpHelper:
    """Unpickled, it calls a function of torch.distributed.checkpoint itself (outside the allow-list)."""

    def __init__(self, src: Path, dst: Path) -> None:
        self.src, self.dst = src, dst

    def __reduce__(self) -> Any:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        return (dcp_to_torch_save, (str(self.src), str(self.dst)))


# -- saving -----------------------------------------------------------------------------------------
def test_keep_1_leaves_only_the_newest_complete_dir(run_dir: Path) -> None:
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [STEP2]  # step 1 pruned, no temporaries
    path = folder / STEP2
    assert sorted(p.name for p in path.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "loop.pt",
        "manifest.json",
    ]
    manifest = verify(path, deep=True)
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "loop.pt"]
    assert manifest["step"] == 2 and manifest["fingerprint"] == {"model": "tiny"}
    assert list_dcp_checkpoints(folder) == [path] and newest_complete(folder) == path
    loop = read_loop(path)
    assert loop["state"]["global_step"] == 2 and isinstance(loop["rng"][0]["torch"], torch.Tensor)
    assert checkpoint_bytes(path) == sum(p.stat().st_size for p in path.iterdir())


def test_each_rank_hashes_only_the_files_it_wrote(run_dir: Path) -> None:
    hashed = [json.loads((run_dir / f"hashed.{rank}.json").read_text())["save"] for rank in (0, 1)]
    assert sorted(hashed[0]) == [".metadata", "__0_0.distcp", "loop.pt"]  # never rank 1's shards
    assert hashed[1] == ["__1_0.distcp"]
    path = run_dir / "checkpoints" / STEP2
    files = json.loads((path / "manifest.json").read_text())["files"]
    assert list(files) == [".metadata", "__0_0.distcp", "__1_0.distcp", "loop.pt"]  # every file, sorted as before
    for name, entry in files.items():
        assert entry == {"size": (path / name).stat().st_size, "sha256": dcp_manifest._sha256(path / name)}, name


def test_deep_verification_at_load_hashes_each_file_on_one_rank(run_dir: Path) -> None:
    hashed = [json.loads((run_dir / f"hashed.{rank}.json").read_text())["load"] for rank in (0, 1)]
    assert sorted(hashed[0] + hashed[1]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "loop.pt"]
    assert hashed[0] and hashed[1]


def test_dcp_flattens_the_state_as_model_and_optim_keys(run_dir: Path, reference: Dict[str, Any]) -> None:
    keys = set(read_metadata(run_dir / "checkpoints" / STEP2).state_dict_metadata)
    assert {f"model.{name}" for name in reference["model"]} <= keys
    assert "optim.state.0.weight.exp_avg" in keys and "optim.param_groups.0.lr" in keys
    assert set(model_entries(read_metadata(run_dir / "checkpoints" / STEP2))) == {
        f"model.{name}" for name in reference["model"]
    }


# -- loading at any world size ---------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 3])
def test_loads_at_another_world_size(run_dir: Path, world: int) -> None:
    _spawn(load_worker, world, str(run_dir))  # the ranks compare every tensor with reference.pt


def test_consolidate_on_one_process_gives_the_full_weights(run_dir: Path, reference: Dict[str, Any]) -> None:
    full = consolidate(run_dir / "checkpoints" / STEP2)
    assert full.keys() == reference["model"].keys()
    for name, tensor in reference["model"].items():
        assert torch.equal(full[name], tensor), name
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 3))
    model.load_state_dict(full)  # names as the unwrapped model has them


# -- hpc-train-export -------------------------------------------------------------------------------
def _export(*args: str) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).parent / "hpc-train-export"), *args]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)


def test_export_writes_a_weights_only_file(run_dir: Path, reference: Dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "out" / "weights.pt"
    done = _export(str(run_dir), str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {out}" and "Warning" not in done.stderr, done.stderr
    weights = torch.load(out, weights_only=True)
    assert weights.keys() == reference["model"].keys()
    assert all(torch.equal(weights[k], v) for k, v in reference["model"].items())
    assert [p.name for p in out.parent.iterdir()] == ["weights.pt"]  # no temporary left


def test_export_errors_are_one_line_exit_2(run_dir: Path, tmp_path: Path) -> None:
    missing = _export(str(run_dir), str(tmp_path / "a.pt"), "--step", "7")
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0 and "Traceback" not in missing.stderr
    assert "no checkpoint of step 7" in missing.stderr and "steps 2" in missing.stderr

    old = tmp_path / "old_run"
    (old / "checkpoints").mkdir(parents=True)
    (old / "checkpoints" / "step_000000003.ckpt").write_bytes(b"x")
    (old / "model.pt").write_bytes(b"x")
    single = _export(str(old), str(tmp_path / "b.pt"))
    assert single.returncode == 2 and single.stderr.strip().count("\n") == 0
    assert "single-file checkpoints" in single.stderr and str(old / "model.pt") in single.stderr
    assert not (tmp_path / "a.pt").exists() and not (tmp_path / "b.pt").exists()


# -- forged and damaged checkpoints -------------------------------------------------------------------
def test_forged_metadata_calling_os_system_is_refused_unrun(copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (copy / ".metadata").write_bytes(pickle.dumps(_RunsCommand(marker)))
    with pytest.raises(IncompleteCheckpoint, match="truncated or corrupt|sha256"):
        verify(copy, deep=True)  # the manifest still describes the real .metadata
    write_manifest(copy, 2, {})  # a forger rewrites the manifest too
    with pytest.raises(UnsafeCheckpoint, match=r"Python global posix\.system") as refused:
        SafeFileSystemReader(copy).read_metadata()
    assert "Nothing in it was run" in str(refused.value)
    for load in (lambda: verify(copy, deep=True), lambda: consolidate(copy)):
        with pytest.raises(UnsafeCheckpoint, match="posix.system"):
            load()
    with pytest.raises(UnsafeCheckpoint, match="posix.system"):
        load_dcp({"model.0.weight": torch.empty(10, 6)}, copy)
    assert not marker.exists()


def test_forged_metadata_with_a_global_outside_the_allow_list_is_refused(copy: Path, tmp_path: Path) -> None:
    with open(copy / ".metadata", "rb") as handle:
        metadata = pickle.load(handle)  # our own file: trusted here
    metadata.planner_data = _CallsDcpHelper(copy, tmp_path / "written.pt")
    (copy / ".metadata").write_bytes(pickle.dumps(metadata))
    write_manifest(copy, 2, {})
    with pytest.raises(UnsafeCheckpoint, match=r"torch\.distributed\.checkpoint\.format_utils\.dcp_to_torch_save"):
        consolidate(copy)
    assert not (tmp_path / "written.pt").exists()
    assert is_complete(copy)  # the cheap check never unpickles: it only compares sizes


def test_forged_non_tensor_entry_is_refused_where_plain_dcp_runs_it(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    forged = tmp_path / "forged"
    dcp.save(
        {"model": {"w": torch.ones(2)}, "evil": _RunsCommand(tmp_path / "ran")}, checkpoint_id=forged, no_dist=True
    )
    dcp_save._write_rank0_files(forged, 1, {})
    plain = tmp_path / "plain"
    shutil.copytree(forged, plain)
    (tmp_path / "ran").unlink(missing_ok=True)

    with pytest.raises(UnsafeCheckpoint, match="entry evil holds objects other than tensors.*posix.system"):
        load_dcp({"model.w": torch.zeros(2), "evil": 0}, forged)
    assert not (tmp_path / "ran").exists()

    # The same checkpoint through DCP's own reader runs the command: what the safe reader prevents.
    dcp.load({"model": {"w": torch.zeros(2)}, "evil": 0}, storage_reader=FileSystemReader(plain), no_dist=True)
    assert (tmp_path / "ran").exists()


def test_forged_tensor_entry_is_refused_unrun(tmp_path: Path) -> None:
    forged, marker = tmp_path / "forged", tmp_path / "ran"
    dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=forged, no_dist=True)
    with open(forged / ".metadata", "rb") as handle:
        metadata = pickle.load(handle)  # our own file: trusted here
    ((index, info),) = [(i, s) for i, s in metadata.storage_data.items() if i.fqn == "model.w"]
    payload = io.BytesIO()
    torch.save(_RunsCommand(marker), payload)
    shard = forged / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as handle:  # the entry now points at a pickle that calls os.system
        handle.write(payload.getvalue())
    metadata.storage_data[index] = type(info)(info.relative_path, offset, len(payload.getvalue()))
    (forged / ".metadata").write_bytes(pickle.dumps(metadata))
    dcp_save._write_rank0_files(forged, 1, {})
    with pytest.raises(UnsafeCheckpoint, match="a tensor entry holds other objects.*posix.system"):
        consolidate(forged)
    assert not marker.exists()


def test_truncated_or_altered_shard_is_refused(copy: Path, run_dir: Path) -> None:
    shard = copy / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    assert not is_complete(copy)
    with pytest.raises(IncompleteCheckpoint, match=r"truncated or corrupt: __1_0\.distcp has \d+ bytes"):
        verify(copy)
    with pytest.raises(IncompleteCheckpoint):
        consolidate(copy)

    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    assert is_complete(copy)  # sizes match: the cheap check passes
    with pytest.raises(IncompleteCheckpoint, match="sha256 of __1_0.distcp"):
        load_dcp({}, copy)

    older = copy.parent / STEP1
    shutil.copytree(run_dir / "checkpoints" / STEP2, older)
    shard.write_bytes(b"")
    assert newest_complete(copy.parent) == older  # the torn newest one is skipped
    assert issubclass(IncompleteCheckpoint, CheckpointError) and issubclass(UnsafeCheckpoint, CheckpointError)


def test_spread_deep_verification_fails_on_every_rank_with_one_message(run_dir: Path, tmp_path: Path) -> None:
    source = run_dir / "checkpoints" / STEP2
    flipped = Path(shutil.copytree(source, tmp_path / "flipped" / STEP2))
    data = (flipped / "__1_0.distcp").read_bytes()
    (flipped / "__1_0.distcp").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    two = Path(shutil.copytree(source, tmp_path / "two" / STEP2))  # the earlier failure wins, as on one process
    (two / ".metadata").write_bytes(
        bytes([(two / ".metadata").read_bytes()[0] ^ 1]) + (two / ".metadata").read_bytes()[1:]
    )
    (two / "loop.pt").write_bytes((two / "loop.pt").read_bytes()[:-1])
    forged, marker = Path(shutil.copytree(source, tmp_path / "forged" / STEP2)), tmp_path / "ran"
    (forged / ".metadata").write_bytes(pickle.dumps(_RunsCommand(marker)))
    write_manifest(forged, 2, {})  # the forger rewrites the manifest too
    report = tmp_path / "report"
    _spawn(corrupt_load_worker, 2, [str(flipped), str(two), str(forged)], str(report))
    found = [json.loads(report.with_suffix(f".{rank}.json").read_text()) for rank in (0, 1)]
    expectations = [
        (flipped, IncompleteCheckpoint, "sha256 of __1_0.distcp"),
        (two, IncompleteCheckpoint, r"sha256 of \.metadata"),
        (forged, UnsafeCheckpoint, r"posix\.system"),
    ]
    for case, (path, error, expected) in enumerate(expectations):
        with pytest.raises(error, match=expected) as alone:
            verify(path, deep=True)  # one process, every file: the message to expect
        for rank in (0, 1):
            assert found[rank][case]["error"] == error.__name__, f"rank {rank}"
            assert found[rank][case]["message"] == str(alone.value), f"rank {rank}"
    assert not marker.exists()
    shard_hashed_on = [rank for rank in (0, 1) if "__1_0.distcp" in found[rank][0]["hashed"]]
    assert len(shard_hashed_on) == 1  # one rank found the flipped bit, the other learned of it


def test_remove_stale_temporaries(tmp_path: Path, run_dir: Path) -> None:
    folder = tmp_path / "checkpoints"
    shutil.copytree(run_dir / "checkpoints" / STEP2, folder / STEP2)
    (folder / ".step_000000003.dcp.tmp").mkdir()
    (folder / ".step_000000003.dcp.tmp" / "__0_0.distcp").write_bytes(b"partial")
    (folder / ".step_000000001.dcp.tmp-pruned").mkdir()
    (folder / ".step_000000004.ckpt.tmp1234").write_bytes(b"torn")  # a single-file checkpoint's temporary
    (folder / "step_000000005.ckpt").write_bytes(b"kept")
    removed = rundir.remove_stale_temporaries(folder)
    assert sorted(p.name for p in removed) == [
        ".step_000000001.dcp.tmp-pruned",
        ".step_000000003.dcp.tmp",
        ".step_000000004.ckpt.tmp1234",
    ]
    assert sorted(p.name for p in folder.iterdir()) == [STEP2, "step_000000005.ckpt"]
    assert rundir.remove_stale_temporaries(tmp_path / "nowhere") == []


_KILLED_SAVE = """
import os, signal, sys
from pathlib import Path
import torch
from hpc_train.records import rundir
from hpc_train.compute.checkpointing import dcp_save

folder, where = Path(sys.argv[1]), sys.argv[2]
def save(step):
    state = {"model": {"w": torch.full((64,), float(step))}}
    return dcp_save.save_dcp(
        state, folder, step, {"step": step}, 3, True, lambda: None, lambda failed: failed, lambda obj: [obj]
    )
save(1)
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
setattr(dcp_save, where, die)
save(2)
"""


@pytest.mark.parametrize("where", ["write_manifest", "install"])
def test_kill_mid_save_leaves_the_previous_checkpoint(tmp_path: Path, where: str) -> None:
    folder = tmp_path / "checkpoints"
    code = textwrap.dedent(_KILLED_SAVE)
    done = subprocess.run([sys.executable, "-c", code, str(folder), where], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == -9, done.stderr
    assert newest_complete(folder) == folder / STEP1
    assert [p.name for p in list_dcp_checkpoints(folder)] == [STEP1]
    assert [p.name for p in rundir.remove_stale_temporaries(folder)] == [".step_000000002.dcp.tmp"]
    assert torch.equal(consolidate(folder / STEP1)["w"], torch.full((64,), 1.0))


# -- a full disk -------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path):
    """A 320 KiB tmpfs: room for one small checkpoint, not for a big one."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_disk_full_raises_on_every_rank_and_keeps_the_previous_checkpoint(small_disk: Path, tmp_path: Path) -> None:
    folder = small_disk / "checkpoints"
    report = tmp_path / "report"
    _spawn(disk_full_worker, 2, str(folder), str(report))
    for rank in (0, 1):
        messages = json.loads(report.with_suffix(f".{rank}.json").read_text())
        assert sorted(messages) == ["loop", "shards"], f"rank {rank} did not raise DiskFull for both saves"
        for message in messages.values():
            assert str(folder) in message and "needs about" in message and "free there" in message
            assert "trainer.keep_checkpoints" in message and "previous checkpoint is kept" in message
        assert "needs about 6" in messages["loop"]  # 640 KiB of zeros in loop.pt
    assert sorted(p.name for p in folder.iterdir()) == [STEP1]  # no temporaries left
    verify(folder / STEP1, deep=True)
    assert read_loop(folder / STEP1)["state"]["global_step"] == 1
