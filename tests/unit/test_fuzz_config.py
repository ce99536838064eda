"""Fuzz the overrides of every key of every config group, in-process, through the CLI's own checks.

Each example composes the shipped config with Hydra's compose API plus one override (wrong
types, negatives, zeros, huge numbers, non-ASCII and control characters, lists, mappings) and
runs what ``hpc-train`` runs before anything starts or is queued: ``check_objective``,
``make_plan``, ``build_job_spec`` and, for ``launcher=slurm``, ``slurm.prepare`` (a dry run:
at most one read-only ``sinfo``, nothing submitted). The outcome must be what the CLI turns
into exit 0 or exit 2 without a traceback: the config validates, or a one-paragraph
ConfigError names a key and the fix. A value of the wrong kind for the key's shipped default
(a string for a whole number, a negative count, a non-boolean for a flag, ...) must be refused
naming that very key.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig, ListConfig, OmegaConf

from hpc_train.conf import CONFIG_DIR
from hpc_train.config import MAPPING_KEYS
from hpc_train.config.cluster import PEAK_PRECISIONS
from hpc_train.config.engine import checked_view, whole_mappings
from hpc_train.config.errors import ConfigError
from hpc_train.contracts.logger_table import TRACKERS
from hpc_train.launch.backends.slurm import params as slurm_params
from hpc_train.launch.backends.slurm import script as slurm_script
from hpc_train.launch.backends.slurm import submit as slurm
from hpc_train.launch.hydra.hydra_errors import translate
from hpc_train.launch.planning.jobspec import build_job_spec
from hpc_train.launch.planning.objective import check_objective
from hpc_train.launch.planning.plan import make_plan

GROUPS = sorted(p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir() and not p.name.startswith("_"))
TOP_LEVEL = ("seed", "job_name", "dry_run", "resume", "objective")
# About a minute in all on 2 cores (a compose is ~0.15 s), the same examples every run (CI stays
# deterministic); HPC_TRAIN_FUZZ_SCALE=20 fuzzes 20x longer with fresh random examples.
SCALE = float(os.environ.get("HPC_TRAIN_FUZZ_SCALE", "1"))
SETTINGS = dict(
    deadline=None,
    database=None,
    derandomize=SCALE == 1,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- the keys: every key of every option of every group, from the shipped conf/ ----------------
@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """CPU workers (no nvidia-smi per example) and the account jean_zay reads from $IDRPROJ."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


ENV = {"CUDA_VISIBLE_DEVICES": "", "IDRPROJ": "fuzz"}


def _image_folder(root: Path) -> Path:
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            (root / split / cls / "x.png").write_bytes(b"png")
    return root


def _container_image(root: Path, runtime: str) -> Path:
    """An image the runtime takes: an OCI bundle folder (its config.json), else a file."""
    if runtime == "oci":
        (root / "bundle").mkdir(parents=True, exist_ok=True)
        (root / "bundle" / "config.json").write_text('{"root": {"path": "rootfs"}, "process": {"env": []}}')
        return root / "bundle"
    (root / "image.sif").write_bytes(b"SIF")
    return root / "image.sif"


def _context(group: str, option: str, image_root: Path) -> List[str]:
    """The overrides that select this option in a config that can run (a Slurm profile with launcher=slurm)."""
    if group == "cluster" and option != "local":
        return ["launcher=slurm", f"cluster={option}"]
    if group == "data" and option == "imagefolder":
        return ["data=imagefolder", f"data.root={image_root}", "data.num_classes=2"]
    if group == "container" and option != "none":  # an image that is there, on Slurm with one task per node
        image = _container_image(image_root, option)
        return ["launcher=slurm", "resources.gpus_per_node=1", f"container={option}", f"container.image={image}"]
    return [f"{group}={option}"]


def _keys(node: Any, prefix: str) -> Iterator[str]:
    """Dotted keys of a node: every leaf, list and nested mapping (the mapping itself too)."""
    for name in node.keys():
        key = f"{prefix}.{name}" if prefix else str(name)
        yield key
        if (
            not OmegaConf.is_missing(node, name)
            and not OmegaConf.is_interpolation(node, name)
            and isinstance(node[name], DictConfig)
        ):
            yield from _keys(node[name], key)


class Targets(list):
    def __repr__(self) -> str:  # hypothesis prints the fixtures of a failing example: keep it short
        return f"<{len(self)} keys>"


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> List[Tuple[Tuple[str, ...], str, Any]]:
    """(context overrides, key, its resolved shipped value) for every key of every option of every group."""
    root = _image_folder(tmp_path_factory.mktemp("images"))
    found: Dict[Tuple[Tuple[str, ...], str], Any] = {}
    with _env(**ENV), initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        base = compose(config_name="config", overrides=["dry_run=true"])
        for key in TOP_LEVEL:
            found[((), key)] = base[key]
        for group in GROUPS:
            for option in sorted(f.stem for f in (Path(CONFIG_DIR) / group).glob("*.yaml")):
                context = tuple(_context(group, option, root))
                cfg = compose(config_name="config", overrides=["dry_run=true", *context])
                for key in _keys(cfg[group], group):
                    found[(context, key)] = OmegaConf.select(cfg, key, throw_on_missing=False)
    assert {
        "seed",
        "trainer.momentum",
        "cluster.gpu_type",
        "launcher.master_port",
        "strategy.schedule",
        "logger.log_dir",
        "data.val_fraction",
    } <= {k for _, k in found}
    return Targets((context, key, value) for (context, key), value in found.items())


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "run"


# -- values, written as Hydra override values -------------------------------------------------
# Quotes, backslashes and '$' are Hydra's own syntax (an unbalanced quote is a parse error,
# tested end to end in test_bad_input.py); everything else goes, non-ASCII and control characters included.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="'\\$"), max_size=12)
HUGE = st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1])
INTS = st.one_of(st.integers(-3, 3), st.integers(-(2**70), 2**70), HUGE)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
LISTS = st.lists(st.one_of(INTS, TEXT, st.booleans()), max_size=3)
MAPPINGS = st.dictionaries(
    st.from_regex(r"[a-z][a-z_]{0,4}", fullmatch=True), st.one_of(INTS, st.booleans()), max_size=2
)


def render(value: Any) -> str:
    """A Python value as Hydra's override grammar writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, list):
        return "[" + ",".join(render(v) for v in value) + "]"
    return "{" + ",".join(f"{k}:{render(v)}" for k, v in value.items()) + "}"


def wrong_kind(default: Any) -> Optional[st.SearchStrategy]:
    """Values no key with this shipped default may take (None: no such class of values for it)."""
    non_integral = st.floats(allow_nan=True, allow_infinity=True).filter(
        lambda f: not (math.isfinite(f) and f == int(f))
    )
    if isinstance(default, bool):
        return st.one_of(INTS, FLOATS, TEXT, st.none(), LISTS, MAPPINGS)
    if isinstance(default, int):
        return st.one_of(
            TEXT,
            st.booleans(),
            non_integral,
            LISTS,
            MAPPINGS,
            st.integers(max_value=-1),
            st.integers(min_value=2**63, max_value=2**80),
        )
    if isinstance(default, float):
        negative = st.one_of(st.integers(max_value=-1), st.floats(max_value=-1e-9, allow_infinity=True))
        return st.one_of(TEXT, st.booleans(), st.sampled_from([math.nan, math.inf]), LISTS, MAPPINGS, negative)
    if isinstance(default, str):
        return st.one_of(st.booleans(), st.floats(allow_nan=True), MAPPINGS)
    if default is None:
        return st.one_of(st.booleans(), MAPPINGS)
    if isinstance(default, ListConfig):
        return st.one_of(INTS, FLOATS, st.booleans(), TEXT)
    if isinstance(default, DictConfig):
        return st.one_of(INTS, FLOATS, st.booleans(), TEXT)
    return None


# -- what the CLI would do ---------------------------------------------------------------------
def names(err_key: str, key: str) -> bool:
    """The error names the key, the node holding it, or a part of it (cluster.setup[0] for cluster.setup)."""
    return err_key == key or key.startswith(err_key + ".") or err_key.startswith((key + ".", key + "["))


def cli_outcome(overrides: List[str], run_dir: Path) -> Tuple[str, Optional[str], str]:
    """("ok" | "refused" | "traceback", the key named, the message) for `hpc-train OVERRIDES`, in-process."""
    try:
        cfg = compose(config_name="config", overrides=whole_mappings(overrides))  # as hpc_train.cli.main passes them
    except (
        Exception
    ) as err:  # Hydra refused the command line: the CLI rewords it (hydra_errors) or prints Hydra's words
        from hydra.errors import HydraException

        translated = translate(err, overrides)
        if translated is not None:
            return "refused", translated.key, translated.message
        if isinstance(err, HydraException):
            return "refused", None, f"{err} {err.__cause__ or ''}"
        return "traceback", None, f"{type(err).__name__}: {err}"
    try:
        check_objective(cfg)
        plan = make_plan(cfg, run_dir)
        spec = build_job_spec(plan)
        if cfg.launcher.name == "slurm":
            slurm.prepare(plan, spec)
    except ConfigError as err:
        return "refused", err.key, err.message
    except Exception as err:
        translated = translate(err)  # the CLI rewords OmegaConf's errors too
        if translated is not None:
            return "refused", translated.key, translated.message
        return "traceback", None, f"{type(err).__name__}: {err}"
    return "ok", None, ""


def _overrides(context: Tuple[str, ...], key: str, value: Any) -> List[str]:
    dry = [] if key == "dry_run" else ["dry_run=true"]  # never submit: a dry run renders the script only
    return [*dry, *context, f"{key}={render(value)}"]


def _assert_clean(outcome: Tuple[str, Optional[str], str], override: str) -> None:
    status, key, message = outcome
    assert status != "traceback", f"{override}: {message}"
    if status == "refused":
        assert "Traceback" not in message, f"{override}: {message}"
        if key is not None:  # a ConfigError: one paragraph with the key and the fix
            assert key and "Fix:" in message and "\n" not in message, f"{override}: {message!r}"


# -- the fuzz ----------------------------------------------------------------------------------


@settings(max_examples=int(120 * SCALE), **SETTINGS)
@given(data=st.data())
def test_a_value_of_the_wrong_kind_is_refused_naming_its_key(data, targets, run_dir):
    candidates = [t for t in targets if wrong_kind(t[2]) is not None]
    context, key, default = data.draw(st.sampled_from(candidates), label="key")
    value = data.draw(wrong_kind(default), label="value")
    overrides = _overrides(context, key, value)
    with _env(**ENV), initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        outcome = cli_outcome(overrides, run_dir)
    _assert_clean(outcome, overrides[-1])
    status, named, message = outcome
    assert status == "refused", f"{overrides[-1]} (shipped value {default!r}) was accepted"
    assert names(named, key) if named is not None else key in message, f"{overrides[-1]}: {message}"


# -- keys Slurm reads: plain ASCII, one line ---------------------------------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data.num_classes=0"], "data.num_classes"),
        (["seed=abc"], "seed"),
        (["trainer.log_every=0"], "trainer.log_every"),
        (["trainer.momentum=abc"], "trainer.momentum"),
        (["cluster=jean_zay", "cluster.gpu_type=b200"], "cluster.gpu_type"),
        (["launcher=slurm", "cluster=jean_zay", "cluster.gpu_type=b200"], "cluster.gpu_type"),
        (["data.image_size=0"], "data.image_size"),
        (["dry_run=maybe"], "dry_run"),
        (["model.num_classes=-1"], "model.num_classes"),
        (["data=synthetic", "data.train.num_samples=0"], "data.train.num_samples"),
        (["launcher=slurm", "cluster=jean_zay", "cluster.types.v100=5"], "cluster.types.v100"),
        (["trainer.loss=null"], "trainer.loss"),
        (["strategy=pipeline", "strategy.split_points=[-1]"], "strategy.split_points"),
    ],
)
def test_found_from_outside(overrides, key, run_dir):
    """The values found by hand, checked the way the fuzz checks: refused naming the key."""
    with _env(**ENV), initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        status, named, message = cli_outcome(
            overrides if "dry_run=maybe" in overrides else ["dry_run=true", *overrides], run_dir
        )
    assert status == "refused" and named == key, f"{overrides}: {status} {message}"
    assert "Fix:" in message


def test_every_shipped_option_validates(targets, run_dir):
    """The shipped defaults of every option pass the table (the fuzz's starting points are valid)."""
    contexts = sorted({context for context, _, _ in targets})
    with _env(**ENV), initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for context in contexts:
            cfg = compose(config_name="config", overrides=["dry_run=true", *context])
            if cfg.strategy.name == "auto":  # no layout of its own: it runs one of the others' (auto_layout)
                checked_view(cfg)
                continue
            plan = make_plan(cfg, run_dir)
            if cfg.launcher.name == "slurm":
                slurm_params.slurm_parameters(plan)


@pytest.mark.parametrize("override", ["model=5", "model=null", "trainer=[1]"])
def test_a_group_choice_that_is_not_a_name_is_refused(override, run_dir):
    with _env(**ENV), initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        status, named, message = cli_outcome(["dry_run=true", override], run_dir)
    assert status == "refused" and named == override.split("=")[0], f"{override}: {status} {message}"


# -- a mapping given whole ----------------------------------------------------------------------
# Each key the table declares a mapping, given a whole valid mapping (cluster.extra={exclusive:true}): accepted
# whatever the shipped node holds ({} in the slurm profile, null, a mapping without those keys, no key at all), and
# every given key reaches the job spec (and, for cluster.extra, the sbatch script).
WORDS = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)
SBATCH_OPTIONS = st.dictionaries(
    st.from_regex(r"[a-z][a-z-]{0,8}", fullmatch=True).filter(lambda name: name != "signal"),  # hpc-train sets --signal
    st.one_of(st.just(True), st.integers(0, 99), WORDS),
    min_size=1,
    max_size=3,
)
# a user's own _target_ (its package findable, as the login side checks) and arguments the shipped node does not have
TARGET = st.builds(
    lambda target, args: {"_target_": target, **args},
    st.from_regex(r"tests\.fuzzed\.[a-z]{1,6}", fullmatch=True),  # findable, not under hpc_train. (not looked up)
    st.dictionaries(
        st.from_regex(r"arg_[a-z]{1,4}", fullmatch=True), st.one_of(st.integers(1, 99), st.booleans()), max_size=2
    ),
)
TRACKER_FLAGS = st.dictionaries(
    st.sampled_from(["tensorboard", "wandb"]), st.booleans(), min_size=1
)  # mlflow needs a tracking URI
PACK = st.fixed_dictionaries(
    {"allocations": st.integers(1, 8)}, optional={"nodes": st.integers(1, 2), "gpus_per_node": st.integers(1, 4)}
)
MAPPING_VALUES = {
    "cluster.extra": SBATCH_OPTIONS,
    "script.overrides": st.dictionaries(WORDS, st.one_of(st.integers(0, 99), WORDS), min_size=1, max_size=3),
    "logger.trackers": TRACKER_FLAGS,
    "launcher.pack": PACK,
    "container.env": st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), st.one_of(st.integers(0, 99), WORDS), max_size=3
    ),
    "cluster.gpu_peak_tflops": st.dictionaries(
        st.sampled_from(PEAK_PRECISIONS), st.one_of(st.integers(1, 5000), st.floats(0.5, 5000.0)), min_size=1
    ),
    "cluster.interconnect": st.fixed_dictionaries(
        {"intra": st.one_of(st.sampled_from(["nvlink", "pcie", "loopback"]), st.integers(1, 900))},
        optional={
            "inter": st.one_of(st.sampled_from(["infiniband", "ethernet"]), st.floats(0.5, 400.0)),
            "intra_latency_us": st.integers(1, 500),
            "inter_latency_us": st.floats(0.5, 500.0),
        },
    ),
}


def _mapping_cases(targets) -> List[Tuple[Tuple[str, ...], str]]:
    """(context, key) for every mapping key, in every option that ships it (or the base config, where none does)."""
    shipped = {(context, key) for context, key, _ in targets if key in MAPPING_KEYS}
    cases = sorted(shipped) + [((), key) for key in sorted(MAPPING_KEYS) if key not in {k for _, k in shipped}]
    return [
        (("launcher=slurm", *context) if key == "cluster.extra" and not context else context, key)
        for context, key in cases
    ]


def test_the_mapping_keys_are_the_tables(targets):
    assert TRACKERS.keys() >= {"tensorboard", "wandb"}
    assert {
        "cluster.extra",
        "script.overrides",
        "logger.trackers",
        "trainer.loss",
        "data.train",
        "model",
    } <= MAPPING_KEYS
    assert {key for _, key in _mapping_cases(targets)} == MAPPING_KEYS


@pytest.mark.parametrize("key", sorted(MAPPING_KEYS))
@settings(max_examples=int(3 * SCALE), **SETTINGS)
@given(data=st.data())
def test_a_mapping_given_whole_is_accepted_and_reaches_the_job(key, data, targets, run_dir):
    context = data.draw(st.sampled_from([c for c, k in _mapping_cases(targets) if k == key]), label="context")
    value = data.draw(MAPPING_VALUES.get(key, TARGET), label="value")
    overrides = ["dry_run=true", *context, f"{key}={render(value)}"]
    with _env(**ENV), initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        try:  # cli_outcome's steps, keeping the job spec and the sbatch parameters
            cfg = compose(config_name="config", overrides=whole_mappings(overrides))
            check_objective(cfg)
            plan = make_plan(cfg, run_dir)
            spec = build_job_spec(plan)
            params = slurm_params.slurm_parameters(plan) if cfg.launcher.name == "slurm" else None
        except Exception as err:
            translated = translate(err, overrides)
            pytest.fail(f"{overrides} was refused: {translated.message if translated else repr(err)}")
    node = OmegaConf.select(OmegaConf.create(spec), key)
    assert {k: node[k] for k in value} == value, f"{overrides}: the job spec has {key}={node}"
    if key == "cluster.extra":
        script = slurm_script.render_sbatch(run_dir / "slurm", params).splitlines()
        for option, given in value.items():
            assert (f"#SBATCH --{option}" if given is True else f"#SBATCH --{option}={given}") in script, overrides
