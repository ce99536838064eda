"""Containers on the login side: each runtime's command line against its documented syntax, for every layout; the
keys refused before anything is queued; the first rank's checks of the image (no process is started here)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from pathlib import Path
from typing import List

import pytest
from hydra import compose, initialize_config_dir

from hpc_train.conf import CONFIG_DIR
from hpc_train.config.engine import whole_mappings
from hpc_train.config.errors import ConfigError
from hpc_train.containers import inside, library
from hpc_train.containers.base import ENTRY_FILE, LAUNCH_ENV_VARIABLES, LAUNCH_PREFIX_VARIABLE, ROOTFS_VARIABLE
from hpc_train.launch.backends.slurm.params import slurm_parameters
from hpc_train.launch.backends.slurm.script import render_sbatch
from hpc_train.launch.planning.plan import make_plan
from hpc_train.processes.rank_env import REPLICA_GROUPS_VARIABLE
from hpc_train.records.job_requests import REQUESTS_VARIABLE
from tests.support.paths import REPO

TINY = ["model=toy_mlp", "data=synthetic", "data.image_size=8", "data.num_samples=64", "trainer.progress=false"]
SLURM = ["launcher=slurm", "dry_run=true", "cluster.cpus_per_gpu=1", "resources.gpus_per_node=2"]
LAYOUTS = {
    "one rank per GPU": ["strategy=ddp"],
    "one process per node": ["strategy=dp"],
    "torchrun per node": ["strategy=ddp", "script.launcher=torchrun", "script.argv=[train.py]"],
    "a script, every task": ["strategy=single", "script.argv=[train.py,'--lr=0.1']"],
}
# Slurm 22.05's OCI support runs one task per node: the layouts that have one.
OCI_LAYOUTS = {
    "one rank per node": ["strategy=ddp", "resources.nodes=2", "resources.gpus_per_node=1"],
    "one process per node": ["strategy=dp"],
    "torchrun per node": ["strategy=ddp", "script.launcher=torchrun", "script.argv=[train.py]"],
}


def _plan(overrides: List[str], tmp_path: Path):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=whole_mappings([*TINY, *SLURM, *overrides]))
    return make_plan(cfg, tmp_path / "runs" / "run")


def _step_line(plan) -> List[str]:
    """The batch script's command line, as words."""
    script = render_sbatch(plan.run_dir / "slurm", slurm_parameters(plan))
    [line] = [line for line in script.splitlines() if line.startswith("exec ")]
    return shlex.split(line)[1:]


@pytest.fixture
def sif(tmp_path):
    image = tmp_path / "pytorch.sif"
    image.write_bytes(b"SIF")
    return image


@pytest.fixture
def bundle(tmp_path):
    image = tmp_path / "bundle"
    (image / "rootfs").mkdir(parents=True)
    env = ["PATH=/opt/image-python/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
    (image / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "process": {"env": env}, "mounts": []}))
    return image


@pytest.fixture(autouse=True)
def _scripts_and_cache(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv(library.CACHE_VARIABLE, str(tmp_path / "cache"))


def _after(words: List[str], marker: str) -> List[str]:
    return words[words.index(marker) + 1 :]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apptainer_command_follows_its_documented_form(layout, sif, tmp_path):
    """`apptainer exec [options] IMAGE COMMAND`: every flag (--nv first) before the image, the job's folders bound
    at the same path, the working directory the submitting one, the image's python3 running hpc_train's entry."""
    words = _step_line(_plan([*LAYOUTS[layout], "container=apptainer", f"container.image={sif}"], tmp_path))
    agent = words[: words.index("--")]
    assert agent[:3] == [sys.executable, "-m", "hpc_train.batchhost.agent"]
    assert {f"--unset={name}" for name in LAUNCH_ENV_VARIABLES} <= set(agent)
    step = _after(words, "--")
    assert step[0] == "srun" and "--kill-on-bad-exit=1" in step
    app = step[step.index("apptainer") :]
    assert app[:3] == ["apptainer", "exec", "--nv"]
    image_at = app.index(str(sif))
    flags, command = app[3:image_at], app[image_at + 1 :]
    binds = [flags[i + 1] for i, flag in enumerate(flags) if flag == "--bind"]
    assert f"{tmp_path}:{tmp_path}" in binds  # the submitting dir, the run dir under it
    lib = library.library_dir()
    assert f"{lib}:{lib}:ro" in binds
    assert flags[flags.index("--pwd") + 1] == str(tmp_path)
    assert "--cleanenv" not in flags
    assert command[:3] == ["python3", "-u", str(lib / ENTRY_FILE)]
    assert command[3:6] == ["-u", "-m", "submitit.core._submit"]


def test_singularity_is_the_same_command_with_its_own_name(sif, tmp_path):
    words = _step_line(
        _plan(["container=apptainer", "container.command=singularity", f"container.image={sif}"], tmp_path)
    )
    assert words[words.index("singularity") + 1] == "exec"
    assert "apptainer" not in words


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pyxis_flags_name_every_variable_the_job_sets(layout, tmp_path, monkeypatch):
    """pyxis keeps an image's value of a variable unless --container-env names it: every variable hpc_train or the
    job sets is named, and container.env's values are exported for the step."""
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    image = "nvcr.io#nvidia/pytorch:24.05-py3"
    words = _step_line(
        _plan([*LAYOUTS[layout], "container=pyxis", f"container.image='{image}'", "container.env={A_B:1}"], tmp_path)
    )
    agent, step = words[: words.index("--")], _after(words, "--")
    flags = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in step if w.startswith("--container")}
    assert flags["--container-image"] == image
    assert flags["--container-workdir"] == str(tmp_path)
    assert f"{tmp_path}:{tmp_path}" in flags["--container-mounts"].split(",")
    named = set(flags["--container-env"].split(","))
    exported = {w.split("=", 1)[1].split("=")[0] for w in agent if w.startswith("--set=")}
    assert exported <= named and "A_B" in exported
    needed = {REQUESTS_VARIABLE, LAUNCH_PREFIX_VARIABLE, "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "NCCL_SOCKET_IFNAME"}
    assert needed <= named
    assert step.index("--container-image=" + image) < step.index("python3")


@pytest.mark.parametrize("layout", OCI_LAYOUTS)
def test_oci_step_writes_its_bundle_and_gives_the_image_path(layout, bundle, tmp_path):
    """srun --container=BUNDLE with the job's own bundle (written at submission; the dry run names it), the image's
    PATH in the step and the launching environment's Python variables removed."""
    plan = _plan([*OCI_LAYOUTS[layout], "container=oci", f"container.image={bundle}"], tmp_path)
    words = _step_line(plan)
    agent, step = words[: words.index("--")], _after(words, "--")
    assert f"--container={plan.run_dir / 'slurm' / 'oci-bundle'}" in step
    assert "--set=PATH=/opt/image-python/bin:/usr/bin:/bin" in agent
    assert f"--set={ROOTFS_VARIABLE}={bundle / 'rootfs'}" in agent
    assert "--unset=VIRTUAL_ENV" in agent and "--unset=PYTHONPATH" in agent
    digest = "sha256:" + hashlib.sha256((bundle / "config.json").read_bytes()).hexdigest()
    assert f"--set=HPC_TRAIN_CONTAINER_DIGEST={digest}" in agent  # recorded in each run's summary
    assert "--unset=SLURM_PROCID" in agent  # the batch shell's would reach every task: the first rank derives it


def test_a_plain_sbatch_scripts_ranks_are_not_silently_run_outside_the_image(bundle, tmp_path):
    """launcher=sbatch only writes the job spec: the script's own srun starts the ranks, on the host's Python."""
    with pytest.raises(ConfigError, match="does not put them in the image") as refused:
        _plan(["launcher=sbatch", "resources.gpus_per_node=1", "container=oci", f"container.image={bundle}"], tmp_path)
    assert refused.value.key == "container" and "launcher=slurm" in refused.value.fix
    assert "container=none" in refused.value.fix


def test_oci_refuses_more_than_one_task_per_node(bundle, tmp_path):
    with pytest.raises(ConfigError, match="one task per node") as refused:
        _plan(["strategy=ddp", "container=oci", f"container.image={bundle}"], tmp_path)
    assert refused.value.key == "container" and "gpus_per_node=1" in refused.value.fix


def test_an_oci_task_takes_its_rank_from_its_node():
    env = {"SLURM_STEP_NODELIST": "node[1-3]"}
    assert inside.oci_task_identity(env, "node2.cluster") is None
    assert (env["SLURM_PROCID"], env["SLURM_NODEID"], env["SLURM_LOCALID"]) == ("1", "1", "0")
    assert "hostname" in inside.oci_task_identity({"SLURM_STEP_NODELIST": "node[1-3]"}, "abc123")


def test_oci_bundle_config_mounts_the_job_at_the_same_path(bundle, tmp_path):
    from hpc_train.containers.job_step import container_step
    from hpc_train.containers.settings import ContainerSettings

    settings = ContainerSettings.from_section({"name": "oci", "image": str(bundle), "mounts": ["/scratch:/data:ro"]})
    step = container_step(settings, [str(tmp_path / "runs")], False, tmp_path / "runs" / "slurm", stage=False)
    [(path, text)] = step.files.items()
    config = json.loads(text)
    assert path == str(tmp_path / "runs" / "slurm" / "oci-bundle" / "config.json")
    assert config["root"]["path"] == str(bundle / "rootfs")
    assert step.links == {str(tmp_path / "runs" / "slurm" / "oci-bundle" / "rootfs"): str(bundle / "rootfs")}
    assert config["process"]["cwd"] == str(tmp_path)
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert mounts[str(tmp_path)]["source"] == str(tmp_path) and "rw" in mounts[str(tmp_path)]["options"]
    assert mounts["/data"]["source"] == "/scratch" and "ro" in mounts["/data"]["options"]


def test_no_container_runs_the_launching_python_through_the_same_agent(tmp_path):
    """One path with or without a container: the agent starts the step; the ranks run this environment's Python."""
    words = _step_line(_plan([], tmp_path))
    step = _after(words, "--")
    assert words[:3] == [sys.executable, "-m", "hpc_train.batchhost.agent"]
    assert step[step.index("--kill-on-bad-exit=1") + 1 :][:4] == [sys.executable, "-u", "-m", "submitit.core._submit"]


def test_the_signal_goes_to_the_batch_host(tmp_path):
    script = render_sbatch((plan := _plan([], tmp_path)).run_dir / "slurm", slurm_parameters(plan))
    assert "#SBATCH --signal=B:USR2@120" in script


@pytest.mark.parametrize(
    "overrides, key, says",
    [
        (["container=apptainer", "container.image=/no/such.sif"], "container.image", "does not exist"),
        (["container=oci", "container.image=/no/bundle"], "container.image", "config.json"),
        (["container=apptainer"], "container.image", "no value"),
        (["container=pyxis", "container.image=x", "launcher=local", "dry_run=false"], "container", "srun"),
        (["container=apptainer", "container.image={sif}", "container.mounts=[data:/data]"], "container.mounts", "SRC"),
        (
            ["container=apptainer", "container.image={sif}", "container.mounts=[/x:{cwd}]"],
            "container.mounts[0]",
            "hide",
        ),
        (
            ["container=apptainer", "container.image={sif}", "container.options=[--bind,/x:{cwd}/runs]"],
            "options",
            "hide",
        ),
        (["container=apptainer", "container.image={sif}", "container.options=[--cleanenv]"], "options[0]", "srun"),
        (["container=apptainer", "container.image={sif}", "container.command=docker"], "container.command", "one of"),
    ],
)
def test_bad_container_input_is_refused_before_anything_is_queued(overrides, key, says, sif, tmp_path):
    filled = [o.format(sif=sif, cwd=tmp_path) for o in overrides]
    with pytest.raises(ConfigError) as refused:
        _plan(filled, tmp_path)
    assert key in refused.value.key and says in str(refused.value), str(refused.value)
    assert refused.value.fix


def test_an_unknown_runtime_is_refused_by_the_group():
    from hydra.errors import MissingConfigException

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        with pytest.raises(MissingConfigException, match="container"):
            compose(config_name="config", overrides=["container=docker"])


MOUNTINFO_HOST = "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
MOUNTINFO_IMAGE = (
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "612 580 254:0 /images/bundle/rootfs / ro,relatime - ext4 /dev/vda rw\n"
)


def test_the_first_rank_reads_its_root_from_mountinfo():
    assert inside.root_of_mounts(MOUNTINFO_HOST) == ("/", "ext4")
    assert inside.root_of_mounts(MOUNTINFO_IMAGE) == ("/images/bundle/rootfs", "ext4")


@pytest.mark.parametrize(
    "seen, env, says",
    [
        ({"torch": None}, {}, "has no torch"),
        ({"torch": "2.3.1+cu121"}, {}, "older than the 2.4"),
        (
            {"torch": "2.5.0"},
            {ROOTFS_VARIABLE: "/images/bundle/rootfs"},
            "ignores --container on a node without oci.conf",
        ),
        ({"torch": "2.5.0"}, {LAUNCH_PREFIX_VARIABLE: sys.prefix}, "launching environment's Python"),
        ({"torch": "2.5.0", "torchft": None}, {REPLICA_GROUPS_VARIABLE: "3"}, "has no torchft"),
    ],
)
def test_the_first_rank_refuses_an_image_that_cannot_run_the_ranks(seen, env, says):
    found = inside.problems(env, {"root": "/", "host": "node1", **seen})
    assert any(says in problem for problem in found), found


def test_an_image_with_torch_inside_its_own_root_passes():
    seen = {"root": "/images/bundle/rootfs", "host": "node1", "torch": "2.11.0+cu128"}
    assert inside.problems({ROOTFS_VARIABLE: "/mnt/shared/images/bundle/rootfs"}, seen) == []
    assert inside.problems({ROOTFS_VARIABLE: "/images/bundle/rootfs"}, seen) == []
    groups = {ROOTFS_VARIABLE: "/images/bundle/rootfs", REPLICA_GROUPS_VARIABLE: "3"}
    assert inside.problems(groups, {**seen, "torchft": "0.2.0"}) == []  # replica groups: torchft in the image too


def test_the_minimum_torch_is_the_one_pyproject_requires():
    text = (REPO / "pyproject.toml").read_text()
    [found] = re.findall(r'"torch>=([0-9]+)\.([0-9]+)"', text)
    assert tuple(map(int, found)) == inside.MIN_TORCH


def test_a_local_oci_task_is_its_own_bundle_run_by_the_runtime(bundle, tmp_path):
    """launcher=local with container=oci: each rank's command and environment go into its own config.json (the OCI
    runtime takes them from there), run in the foreground by container.command."""
    from hpc_train.containers.job_step import local_container
    from hpc_train.containers.settings import ContainerSettings

    settings = ContainerSettings.from_section({"name": "oci", "image": str(bundle), "command": "runc"})
    image = local_container(settings, [str(tmp_path / "runs")], False, tmp_path / "runs" / "r" / "container")
    env = {"PATH": "/venv/bin:/usr/bin", "VIRTUAL_ENV": "/venv", "RANK": "1"}
    command, changed = image.task(["-m", "hpc_train.compute.worker", "spec.yaml"], env, "hpc-train-1-1")
    folder = tmp_path / "runs" / "r" / "container" / "oci-bundle-hpc-train-1-1"
    assert command == ["runc", "run", "--bundle", str(folder), "hpc-train-1-1"]
    config = json.loads((folder / "config.json").read_text())
    assert config["process"]["args"][:2] == ["python3", "-u"] and config["process"]["args"][-3:] == [
        "-m",
        "hpc_train.compute.worker",
        "spec.yaml",
    ]
    process_env = dict(item.split("=", 1) for item in config["process"]["env"])
    assert process_env["PATH"] == "/opt/image-python/bin:/usr/bin:/bin" and process_env["RANK"] == "1"
    assert "VIRTUAL_ENV" not in process_env and changed["RANK"] == "1"
    assert not any(n.get("type") == "network" for n in config.get("linux", {}).get("namespaces", []))


def test_local_apptainer_prefixes_each_rank(sif, tmp_path):
    from hpc_train.containers.job_step import local_container
    from hpc_train.containers.settings import ContainerSettings

    settings = ContainerSettings.from_section({"name": "apptainer", "image": str(sif)})
    image = local_container(settings, [str(tmp_path / "runs")], True, tmp_path / "runs" / "r" / "container")
    command, changed = image.task(["-m", "hpc_train.compute.worker", "spec.yaml"], {"PYTHONPATH": "/x"}, "t0")
    assert command[:3] == ["apptainer", "exec", "--nv"] and command[command.index(str(sif)) + 1] == "python3"
    assert "PYTHONPATH" not in changed


def test_every_option_of_the_container_group_but_none_has_its_runtime():
    from hpc_train.config.container import NAMES, NO_CONTAINER
    from hpc_train.containers.registry import RUNTIMES

    shipped = {path.stem for path in (Path(CONFIG_DIR) / "container").glob("*.yaml")}
    assert shipped == set(NAMES) and set(RUNTIMES) == set(NAMES) - {NO_CONTAINER}


def test_a_cluster_profile_picks_the_sites_container_and_the_command_line_wins(sif, tmp_path):
    """A site's profile selects its own container option (the runtime and the image) from its defaults list; the
    same selection reaches a Hydra app through hydra.launcher.cluster; container=... on the command line wins."""
    from hpc_train.launch.hydra import cli_child
    from hpc_train.launch.hydra.app_config import composed_profile

    (tmp_path / "my_conf" / "cluster").mkdir(parents=True)
    (tmp_path / "my_conf" / "container").mkdir()
    (tmp_path / "my_conf" / "container" / "mysite.yaml").write_text(
        f"defaults:\n  - apptainer\n  - _self_\nimage: {sif}\n"
    )
    (tmp_path / "my_conf" / "cluster" / "mysite.yaml").write_text(
        "defaults:\n  - slurm\n  - override /container@_global_.container: mysite\n  - _self_\nname: mysite\n"
    )
    config_dir = str(tmp_path / "my_conf")
    cfg, _ = cli_child.compose(["cluster=mysite", "launcher=slurm"], config_dir)
    assert (cfg.container.name, cfg.container.image) == ("apptainer", str(sif))
    cfg, _ = cli_child.compose(["cluster=mysite", "launcher=slurm", "container=none"], config_dir)
    assert cfg.container.name == "none"
    _, container = composed_profile(str(tmp_path / "my_conf" / "cluster" / "mysite.yaml"))
    assert (container["name"], container["image"]) == ("apptainer", str(sif))
