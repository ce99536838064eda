"""From a laptop, the parts that start no process: an SSH destination read as ssh reads it, ssh's failures told
apart by its own words, the remote shell line, paths said the cluster's way, the project's file list (.gitignore
without git) and its size limit, the run-dir records packed and unpacked, and a sweep job's link to the cluster."""

from __future__ import annotations

import io
import json
import os
import shlex
from pathlib import Path

import pytest

from hpc_train import api
from hpc_train.config.engine import checked_view
from hpc_train.config.errors import ConfigError
from hpc_train.errors import DiskFull, Unreachable
from hpc_train.hosts.ssh import SshTarget, kind_of, remote_line, said_line
from hpc_train.launch.hydra import exits
from hpc_train.records.rundir import EXIT_REFUSED
from hpc_train.remote import paths, serve, sync
from hpc_train.remote.connection import Connection
from hpc_train.remote.settings import RemoteLink, RemoteSettings, read_link, write_link

# What OpenSSH 9.2 says for each failure (captured from the test server; the slurm tier meets them for real).
SSH_SAYS = {
    "host_key_unknown": "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\r\n"
    "Host key verification failed.",
    "host_key_changed": "@@@@@@@@\n@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @\nHost key verification failed.",
    "auth_refused": "hpccluster@127.0.0.1: Permission denied (publickey).",
    "unreachable": "ssh: connect to host 127.0.0.1 port 2999: Connection refused",
    "dropped": "Connection to 127.0.0.1 closed by remote host.",
}
# What rsync 3.5.0 says (exit status 12) when its remote shell ends at once: `rsync -a -e true DIR/ login:/r/`.
RSYNC_CUT = (
    "rsync: [sender] safe_write failed to write 4 bytes to socket: Broken pipe (32)\n"
    "rsync error: error in rsync protocol data stream (code 12) at io.c(387) [sender=3.5.0]"
)


def test_an_ssh_destination_is_read_as_ssh_reads_it():
    assert SshTarget("ssh://me@login.example.org:2222").host_and_port() == ("me@login.example.org", "2222")
    assert SshTarget("ssh://login.example.org").host_and_port() == ("login.example.org", None)
    assert SshTarget("me@login").host_and_port() == ("me@login", None)
    assert SshTarget("mysite").destination() == "mysite"
    assert "-p" in SshTarget("ssh://me@h:2222").options() and "2222" in SshTarget("ssh://me@h:2222").options()
    options = " ".join(SshTarget("me@h").options())
    assert "BatchMode=yes" in options and "StrictHostKeyChecking=yes" in options  # never a prompt, never a new key
    for bad in ("-oProxyCommand=touch /tmp/x", "me@host extra", ""):
        with pytest.raises(ValueError):
            SshTarget(bad)


def test_a_login_that_ssh_would_read_as_an_option_is_refused_before_anything():
    with pytest.raises(ConfigError) as refused:
        checked_view(api.compose(["launcher=slurm", "cluster=slurm", "cluster.login=-oProxyJump"]))
    assert refused.value.key == "cluster.login" and "ssh://" in refused.value.fix
    cfg = api.compose(["launcher=slurm", "cluster=slurm", "cluster.login=ssh://me@login.example.org:2222"])
    settings = RemoteSettings.of(cfg)
    assert settings.enabled and settings.python == "python3" and settings.sync == "auto"
    assert settings.project_dir(Path("/home/me/work/proj")) == "~/hpc-train/proj"
    assert not RemoteSettings.of(api.compose(["launcher=slurm", "cluster=slurm"])).enabled


@pytest.mark.parametrize("kind", sorted(SSH_SAYS))
def test_each_failure_of_ssh_is_told_by_its_own_words(kind):
    assert kind_of(SSH_SAYS[kind]) == kind
    assert kind_of(said_line(SSH_SAYS[kind])) == kind
    assert kind_of("sacct: error: Slurm accounting storage is disabled") == "other"


def test_the_remote_line_runs_the_setup_quietly_then_the_command_quoted():
    line = remote_line(["module load python", "source ~/env/bin/activate"], ["sacct", "-j", "1 2"], {"A": "x y"}, "~/p")
    assert line.startswith("{ module load python; source ~/env/bin/activate; } >&2 </dev/null && cd ")
    assert line.endswith("exec env 'A=x y' sacct -j '1 2'")
    assert remote_line([], ["squeue", "--me"]) == "exec squeue --me"
    assert shlex.split(remote_line([], ["echo", "$HOME; rm -rf /"]))[-1] == "$HOME; rm -rf /"  # data, not shell


def test_paths_under_the_project_become_their_cluster_copies(tmp_path):
    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    assert paths.remote_of(str(project / "data"), project, "/home/c/hpc-train/proj") == "/home/c/hpc-train/proj/data"
    assert paths.remote_of(str(project), project, "/r") == "/r"
    assert paths.remote_of("/scratch/shared/imagenet", project, "/r") == "/scratch/shared/imagenet"
    overrides = [
        f"hydra.run.dir={project}/outputs/a",
        f"script.argv=[train.py,--data={project}/data,/nowhere/on/this/machine]",
        "trainer.lr=0.1",
        "hydra/sweeper=basic",
    ]
    assert paths.translate(overrides, project, "/r", conn=None) == [  # type: ignore[arg-type]
        "hydra.run.dir=/r/outputs/a",
        "script.argv=[train.py,--data=/r/data,/nowhere/on/this/machine]",
        "trainer.lr=0.1",
        "hydra/sweeper=basic",
    ]


def test_the_project_file_list_reads_gitignore_files_without_git(tmp_path):
    root = tmp_path / "proj"
    for rel in (
        "train.py", "conf/config.yaml", "data/big.bin", "pkg/__pycache__/m.pyc", "pkg/m.py", "pkg/.gitignore",
        "pkg/local.log", "outputs/2026/run/summary.json", "multirun/x/jobs.tsv", "venv/pyvenv.cfg", "venv/lib/x.py",
        ".git/HEAD", "notes.txt", "sub/data/keep.txt",
    ):  # fmt: skip
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    (root / ".gitignore").write_text("/data/\n*.txt\n")
    (root / "pkg" / ".gitignore").write_text("*.log\n")
    found = sorted(rel for rel in sync._walked_files(root) if sync._kept(rel))
    assert found == [".gitignore", "conf/config.yaml", "pkg/.gitignore", "pkg/m.py", "train.py"]


def test_a_project_over_the_size_limit_is_refused_naming_its_biggest_folder(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard.bin").write_bytes(b"\0" * (3 * 2**20))
    (tmp_path / "train.py").write_text("print(1)\n")
    files = ["data/shard.bin", "train.py"]
    assert sync.check_size(tmp_path, files, limit_mb=4) == 3 * 2**20 + 9
    with pytest.raises(ConfigError) as refused:
        sync.check_size(tmp_path, files, limit_mb=2)
    assert refused.value.key == "cluster.sync_limit_mb"
    assert "data/ (3 MB)" in refused.value.problem and ".gitignore" in refused.value.fix


def test_a_sync_or_a_fetch_that_fails_is_said_by_its_family():
    """A connection cut under rsync is Unreachable, as ssh's own failure in words ssh is not known to say is; a full
    disk there is DiskFull (exit code 2, naming cluster.remote_dir); the cluster's side failing is a ConfigError
    naming the key at fault."""
    conn = Connection(RemoteSettings(login="me@login.example.org"))  # nothing opened: the failures are said only
    with pytest.raises(Unreachable) as lost:
        raise sync.rsync_failure(conn, "/r", 12, RSYNC_CUT)
    assert lost.value.key == "cluster.login" and "run the command again" in lost.value.fix
    no_space = 'rsync: [receiver] write failed on "/r/a.py": No space left on device (28)'
    full = sync.rsync_failure(conn, "/r", 11, no_space)
    assert isinstance(full, DiskFull) and "`cluster.remote_dir`" in str(full) and "No space left" in str(full)
    assert exits.exit_code(full) == EXIT_REFUSED
    said = "could not write under /r on the cluster: [Errno 13] Permission denied: '/r'"
    refused = conn.failure(1, said, "cluster.remote_dir", "copying the project", "set cluster.remote_dir.")
    assert type(refused) is ConfigError and refused.key == "cluster.remote_dir" and "Permission denied" in str(refused)
    ended = conn.failure(255, "a word ssh is not known to say", "cluster.remote_python", "reading /r", "run it there.")
    assert isinstance(ended, Unreachable) and ended.key == "cluster.login" and "connection" in ended.problem


def _members(packed):
    """The file names a packed tar stream holds (its size says nothing: tarfile pads every archive to 10 KiB)."""
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(packed.getvalue()), mode="r|") as stream:
        return sorted(member.name for member in stream if member.isfile())


def test_records_are_packed_without_checkpoints_and_only_what_changed(tmp_path):
    run = tmp_path / "cluster" / "run"
    for rel, data in (
        ("summary.json", b"{}"), ("metrics.jsonl", b"{}\n"), ("logs/rank0.log", b"log"),
        ("checkpoints/step_4.ckpt", b"w" * 100), ("slurm/1_submitted.pkl", b"p"),
    ):  # fmt: skip
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(data)
    here = tmp_path / "laptop" / "run"
    stream = io.BytesIO()
    serve.pack(run, {}, everything=False, out=stream)
    assert serve.unpack(here, io.BytesIO(stream.getvalue())) == 0
    assert sorted(str(p.relative_to(here)) for p in here.rglob("*") if p.is_file()) == [
        "logs/rank0.log", "metrics.jsonl", "summary.json",
    ]  # fmt: skip
    have = {
        str(p.relative_to(here)): [p.stat().st_size, int(p.stat().st_mtime)] for p in here.rglob("*") if p.is_file()
    }
    again = io.BytesIO()
    serve.pack(run, have, everything=False, out=again)
    assert _members(again) == []  # nothing changed, nothing sent
    (run / "metrics.jsonl").write_bytes(b"{}\n{}\n")
    changed = io.BytesIO()
    serve.pack(run, have, everything=False, out=changed)
    assert _members(changed) == ["metrics.jsonl"]
    everything = io.BytesIO()
    serve.pack(run, have, everything=True, out=everything)
    assert "checkpoints/step_4.ckpt" in _members(everything)
    serve.unpack(here, io.BytesIO(everything.getvalue()))
    assert (here / "checkpoints" / "step_4.ckpt").read_bytes() == b"w" * 100


class _Watched(io.BytesIO):
    """A tar stream that, before each read, looks at ``path`` as a reader there would (a report, a rank)."""

    def __init__(self, data: bytes, path: Path) -> None:
        super().__init__(data)
        self.path, self.seen = path, set()

    def read(self, size=-1):
        if self.path.exists():
            self.seen.add(self.path.read_bytes())
        return super().read(size)


@pytest.mark.parametrize(
    "unpacking",
    [lambda root, source: serve.unpack(root, source), lambda root, source: serve.receive(source, root)],
    ids=["unpack, the cluster's side", "receive, the laptop's mirror"],
)
def test_a_file_a_tar_stream_brings_replaces_the_old_one_whole(tmp_path, unpacking):
    """While the stream is read, a reader of summary.json sees the old one until the new one is whole, never part
    of it; the new one keeps the member's mode and mtime (what the next sync or refresh compares)."""
    import tarfile

    old, new = b'{"old": true}', json.dumps({"loss": [0.5] * 200_000}).encode()  # ~1 MB: read in many pieces
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        info = tarfile.TarInfo("summary.json")
        info.size, info.mtime, info.mode = len(new), 1_700_000_000, 0o640
        tar.addfile(info, io.BytesIO(new))
    (tmp_path / "summary.json").write_bytes(old)
    source = _Watched(packed.getvalue(), tmp_path / "summary.json")
    unpacking(tmp_path, source)
    assert old in source.seen and source.seen <= {old, new}, sorted(len(seen) for seen in source.seen)
    assert (tmp_path / "summary.json").read_bytes() == new and os.listdir(tmp_path) == ["summary.json"]
    info = (tmp_path / "summary.json").stat()
    assert int(info.st_mtime) == 1_700_000_000 and info.st_mode & 0o777 == 0o640


def test_a_tar_naming_a_path_outside_its_folder_writes_nothing_there(tmp_path):
    import tarfile

    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        for name in ("../escaped.txt", "/tmp/absolute.txt", "fine.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    assert serve.unpack(tmp_path / "in", io.BytesIO(stream.getvalue())) == 0
    assert (tmp_path / "in" / "fine.txt").exists() and not (tmp_path / "escaped.txt").exists()


def test_a_sweep_job_dir_is_linked_through_its_sweep_dir(tmp_path):
    sweep = tmp_path / "multirun" / "2026-11-28" / "10-00-00"
    link = RemoteLink("testcluster", "/home/c/hpc-train/p/multirun/2026-11-28/10-00-00", "python3", ["module load x"])
    write_link(sweep, link)
    (sweep / "3").mkdir()
    assert read_link(sweep) == link
    assert read_link(sweep / "3").path == link.path + "/3"
    assert json.loads((sweep / "remote.json").read_text())["login"] == "testcluster"
    assert read_link(tmp_path) is None
    assert sorted(os.listdir(sweep)) == ["3", "remote.json"]  # no temporary file left beside the link


class _Cluster:
    """Somewhere else that runs Slurm's commands (the shape of hosts.SshHost): what it was asked, and its answer."""

    def __init__(self) -> None:
        self.asked: list = []

    def run(self, args, timeout=None, env=None, **how):
        import subprocess

        assert how == {"text": True, "failure": "return"}  # Slurm's callers read any failure as no answer
        self.asked.append((list(args), dict(env or {})))
        return subprocess.CompletedProcess(list(args), 0, "1|RUNNING\n", "")


def test_slurms_commands_go_where_the_switch_says_and_nowhere_else():
    from hpc_train.hosts import hosts
    from hpc_train.slurm import slurm_cli

    cluster = _Cluster()
    with hosts.commands_on(cluster):
        assert slurm_cli.query(["squeue", "-h"], env={**os.environ, "SLURM_TIME_FORMAT": "%s"}) == "1|RUNNING\n"
    assert cluster.asked == [(["squeue", "-h"], {**os.environ, "SLURM_TIME_FORMAT": "%s"})]
    assert hosts.current() is None  # the block ended: this machine again
    refused = hosts.Unconnected("mysite").run(["sinfo"], 5, text=True, failure=hosts.RETURN)
    assert refused.returncode == 127 and "no connection to mysite is open" in refused.stderr
    with pytest.raises(Unreachable, match="no connection to mysite is open"):
        hosts.Unconnected("mysite").run(["sinfo"], 5)


def test_a_hydra_apps_profile_with_a_login_is_refused_with_the_way_that_works(tmp_path):
    from hpc_train.launch.hydra import app_config

    profile = tmp_path / "my_conf" / "cluster" / "faraway.yaml"
    profile.parent.mkdir(parents=True)
    profile.write_text("defaults:\n  - slurm\n  - _self_\nname: faraway\nlogin: me@login.example.org\n")
    with pytest.raises(ConfigError) as refused:
        app_config.cluster_profile(str(profile))
    assert refused.value.key == "hydra.launcher.cluster" and "hpc-train cluster=... -- your_app.py" in refused.value.fix


def test_the_connect_hint_carries_the_overrides_that_name_the_cluster():
    """hpc-train-connect, pasted, must reach the cluster the command named: the login given as an override (the
    profile has none), the setup and Python beside it, the user's config dir, the launcher's default profile."""
    from omegaconf import OmegaConf

    from hpc_train.launch.hydra import forwarding

    hydra_cfg = OmegaConf.create(
        {
            "overrides": {
                "task": ["launcher=slurm", "cluster=slurm", "cluster.login=me@site", "cluster.setup=[module load x]"]
            },
            "runtime": {"choices": {"cluster": "slurm"}, "config_sources": []},
        }
    )
    settings = RemoteSettings(
        login="me@site", profile="slurm", connect_words=tuple(forwarding.connect_words(hydra_cfg))
    )
    command = shlex.split(settings.connect_command())
    assert command == ["hpc-train-connect", "cluster=slurm", "cluster.login=me@site", "cluster.setup=[module load x]"]
    hydra_cfg.overrides.task = ["launcher=slurm", "+cluster.login=me@site"]  # the cluster is the launcher's default
    hydra_cfg.runtime.config_sources = [{"provider": "command-line", "schema": "file", "path": "/p/my conf"}]
    assert forwarding.connect_words(hydra_cfg) == [
        "--config-dir",
        "/p/my conf",
        "cluster=slurm",
        "+cluster.login=me@site",
    ]
    assert RemoteSettings(login="me@site").connect_command() == "hpc-train-connect me@site"


def test_a_laptops_dry_run_names_the_clusters_run_dir_and_what_the_cluster_fills_in(tmp_path):
    local = paths.ClusterSide("site", "python3", "~/hpc-train/proj", tmp_path, resolved=False)
    rendered = local.render_dir(tmp_path / "outputs" / "a")
    assert rendered.is_absolute() and local.shown(str(rendered)) == "~/hpc-train/proj/outputs/a"
    assert "fills in ~" in local.note("~/hpc-train/proj/outputs/a") and "python3" in local.note("~/x")
    there = paths.ClusterSide("site", "/opt/py/bin/python", "/home/me/hpc-train/proj", tmp_path, resolved=True)
    assert there.render_dir(tmp_path / "outputs" / "a") == Path("/home/me/hpc-train/proj/outputs/a")
    assert "fills in" not in there.note("/home/me/hpc-train/proj/outputs/a")
