"""The command line of a script job (``script.*``): one function for the dry run and for every rank.

``hpc-train [overrides] -- train.py ARGS`` runs the user's own script instead of hpc_train's
trainer. Its command is ``script.argv`` (``[train.py, ARGS...]`` or ``[-m, package.module,
ARGS...]``), run with the job's Python, then one argument per ``script.overrides`` key (how a
sweep varies the script: ``+script.overrides.learning_rate=1e-3,1e-4``), spelled by
``script.arg_style`` with values in Python's spelling (nanoGPT's configurator ``literal_eval``s
them and checks their type), then ``script.resume_args`` on every attempt after the first.
No torch here: the login node renders the same command.
"""

from __future__ import annotations

import re
from typing import Any, List, Mapping, Sequence

ARG_STYLES = ("--{key}={value}", "--{key} {value}", "{key}={value}")
SEPARATOR = "--"  # on the hpc-train command line: what follows is the script's command


def is_script_job(cfg: Mapping[str, Any]) -> bool:
    """A job that runs the user's own script (script.argv set) instead of hpc_train's trainer; `cfg` is a config,
    a config view or a job spec."""
    return (cfg.get("script") or {}).get("argv") is not None


def python_spelling(value: Any) -> str:
    """A config value as Python writes it: True, None, 0.001, [1, 2]; text as it is (abc, not 'abc')."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, dict)) or value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return str(value)


def override_args(overrides: Mapping[str, Any], style: str) -> List[str]:
    """One argument (two with ``--{key} {value}``) per key of script.overrides, in their order."""
    args: List[str] = []
    for key, value in overrides.items():
        text = python_spelling(value)
        if style == "--{key} {value}":
            args += [f"--{key}", text]
        else:
            args.append(style.format(key=key, value=text))
    return args


def script_args(script: Mapping[str, Any], resume: bool) -> List[str]:
    """The script (``train.py`` or ``-m package.module``) and its arguments, without the interpreter."""
    argv = [str(a) for a in script["argv"]]
    args = argv + override_args(script["overrides"], str(script["arg_style"]))
    if resume:
        args += [str(a) for a in script["resume_args"]]
    return args


def direct_command(script: Mapping[str, Any], python: str, resume: bool) -> List[str]:
    """What each task runs with script.launcher=direct."""
    return [python, *script_args(script, resume)]


def torchrun_command(
    script: Mapping[str, Any], python: str, resume: bool, nodes: int, per_node: int, endpoint: str, run_id: str
) -> List[str]:
    """What each node's one task runs with script.launcher=torchrun: torchrun starts the node's ranks."""
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
        *script_args(script, resume),
    ]  # fmt: skip


def hydra_list(items: Sequence[str]) -> str:
    """`items` as a Hydra override list of quoted strings, each read back exactly (interpolations stay live)."""

    def quoted(text: str) -> str:
        # Hydra unescapes backslashes only before a quote or at the end of a quoted string.
        text = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text)
        return "'" + text.replace("'", "\\'") + "'"

    return "[" + ",".join(quoted(item) for item in items) + "]"


def split_command_line(argv: List[str]) -> List[str]:
    """hpc-train's own arguments, with everything after ``--`` turned into the override ``script.argv=[...]``."""
    if SEPARATOR not in argv:
        return argv
    index = argv.index(SEPARATOR)
    return [*argv[:index], f"script.argv={hydra_list(argv[index + 1 :])}"]
