"""One launcher interface: the registry alone maps a launcher's name to code, and nothing else in the package
compares a launcher's name; every launcher the config accepts has a backend, and each backend does what its
declared kind says."""

import ast

import pytest

from hpc_train.config.launcher import APP_LAUNCHERS, LAUNCHERS
from hpc_train.launch.backends import registry
from hpc_train.launch.backends.base import Backend, JobRef
from tests.support.paths import SRC

NAMES = set(LAUNCHERS) | set(APP_LAUNCHERS)
# Where a launcher's name is declared (the key's values and what each is) and mapped to code: nowhere else.
DECLARED_IN = {"hpc_train/config/launcher.py", "hpc_train/launch/backends/registry.py"}


def _strings(node):
    """The string constants a comparison operand holds (itself, or the items of a tuple, list or set)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def _comparisons_with_a_launcher_name(path, root=SRC):
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            named = set().union(*(_strings(operand) for operand in [node.left, *node.comparators])) & NAMES
            if named:
                found.append(f"{path.relative_to(root)}:{node.lineno} compares with {sorted(named)}")
    return found


def test_no_module_compares_a_launcher_name():
    """`x == "slurm"`, `name in ("local", "slurm")`, `!= "sbatch"`: each is a place that must change for a new way of
    running jobs. Behaviour comes from the backend (the registry's) or the launcher's declared kind."""
    paths = [*sorted((SRC / "hpc_train").rglob("*.py")), *sorted((SRC / "hydra_plugins").rglob("*.py"))]
    found = [
        hit
        for path in paths
        if str(path.relative_to(SRC)) not in DECLARED_IN
        for hit in _comparisons_with_a_launcher_name(path)
    ]
    assert not found, "launcher names compared outside the registry:\n" + "\n".join(found)


def test_the_check_itself_finds_a_comparison(tmp_path):
    """The test above can fail: a module that compares a launcher's name is found. The probe module is written in a
    temporary folder, never in the package (another worker's scan could meet it there, a killed run leave it)."""
    path = tmp_path / "hpc_train" / "zz_probe.py"
    path.parent.mkdir()
    path.write_text('def f(cfg):\n    return cfg.launcher.name in ("local", "slurm") or cfg.x != "sbatch"\n')
    assert _comparisons_with_a_launcher_name(path, root=tmp_path) == [
        "hpc_train/zz_probe.py:2 compares with ['local', 'slurm']",
        "hpc_train/zz_probe.py:2 compares with ['sbatch']",
    ]


def test_every_launcher_has_a_backend_of_its_kind():
    for name, kind in LAUNCHERS.items():
        backend = registry.backend_for(name)
        assert isinstance(backend, Backend) and backend.kind is kind and backend.name == name
    for app_name, app in APP_LAUNCHERS.items():
        assert registry.app_backend(app_name).kind is LAUNCHERS[app.backend]


def test_an_unknown_launcher_is_refused_with_the_key_and_the_choices():
    from hpc_train.config.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        registry.backend_for("pbs")
    assert refused.value.key == "launcher.name"
    assert all(f"launcher={name}" in refused.value.fix for name in LAUNCHERS)


def test_a_watch_says_how_often_to_look_and_whether_the_command_is_the_job(tmp_path):
    """The local backend watches its own process (whose exit code is the job's); Slurm's watch asks Slurm."""
    local = registry.backend_for("local").watch(JobRef("local-1", tmp_path))
    slurm = registry.backend_for("slurm").watch(JobRef("123", tmp_path))
    assert local.command_is_the_job and not slurm.command_is_the_job
    assert local.poll_s < slurm.poll_s
    assert local.state() == "UNKNOWN"  # no process, no exit code, no summary: nothing says how it ended
    (tmp_path / "summary.json").write_text("{}")
    assert local.state() == "COMPLETED"


def test_a_packed_run_cannot_be_cancelled_alone(tmp_path):
    watch = registry.backend_for("slurm").watch(JobRef("123:4", tmp_path / "4"))
    with pytest.raises(ValueError, match="scancel 123"):
        watch.cancel()


def test_each_app_launcher_named_once_is_the_class_hydra_instantiates():
    """APP_LAUNCHERS is the one spelling of the app launchers: its target is a class under hydra_plugins that
    carries its name, and Hydra's config store offers it under that name with that target."""
    import importlib

    from hydra.core.config_store import ConfigStore

    for name, app in APP_LAUNCHERS.items():
        module, _, class_name = app.target.rpartition(".")
        assert getattr(importlib.import_module(module), class_name).launcher_name == name
        stored = ConfigStore.instance().load(f"hydra/launcher/{name}.yaml").node
        assert stored._target_ == app.target
