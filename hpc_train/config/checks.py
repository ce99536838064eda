"""The value checkers the declarations are made of: each takes a value and returns None or what is wrong.

Why a library of small checkers: a declaration reads as what the key accepts (``whole(1, 1024)``,
``one_of("gres", "gpus-per-node")``), each checker carries the type text the configuration
reference shows, and the messages are written once. Values are plain (resolved) data; a list may
still be an OmegaConf ListConfig where the engine reads a config that does not resolve. Rules:
booleans must be real booleans; whole numbers must not be booleans; numbers must be finite; text
never holds control characters.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from typing import Any, Callable, Optional, Tuple

from hpc_train.slurm.slurm_time import limit_minutes

Problem = Optional[str]  # None: the value is fine; else what is wrong, as a sentence fragment
Checker = Callable[[Any], Problem]

INT64_MAX = 2**63 - 1  # what torch, numpy and C code downstream can hold
MINUTES_PER_YEAR = 365 * 24 * 60
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def show(value: Any) -> str:
    """repr, cut short: the message stays one readable line whatever was passed."""
    text_ = repr(value)
    return text_ if len(text_) <= 80 else text_[:60] + f"... ({len(text_)} characters)"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_list(value: Any) -> bool:
    if isinstance(value, list):
        return True
    omegaconf = sys.modules.get("omegaconf")  # a ListConfig exists only once OmegaConf is loaded: no import here
    return omegaconf is not None and isinstance(value, omegaconf.ListConfig)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))  # math.isfinite(10**400) would raise


# -- checkers: each returns None or the problem ------------------------------------------------
def typed(what: str, check: Checker) -> Checker:
    """`check`, carrying the text the configuration reference shows as the key's type."""
    check.what = what  # type: ignore[attr-defined]
    return check


def type_text(check: Checker) -> str:
    return getattr(check, "what", "see the description")


def whole(low: int = 1, high: int = INT64_MAX) -> Checker:
    def check(value: Any) -> Problem:
        if not _is_int(value):
            return f"must be a whole number, got {show(value)}"
        if value < low:
            return f"must be at least {low}, got {show(value)}"
        if value > high:
            return f"must be at most {high}, got {show(value)}"
        return None

    return typed(f"whole number, {low} to {high}" if high < INT64_MAX else f"whole number >= {low}", check)


_COUNT_RANGE = re.compile(r"([0-9]+)-([0-9]+)")


def count_or_range(low: int = 1, high: int = INT64_MAX) -> Checker:
    """A whole number, or the text ``MIN-MAX`` (``2-4``) with low <= MIN <= MAX <= high: a count Slurm may choose."""
    count = whole(low, high)
    wanted = "a whole number or a range MIN-MAX such as 2-4"

    def check(value: Any) -> Problem:
        if not isinstance(value, str):
            problem = count(value)
            return problem.replace("a whole number", wanted, 1) if problem else None
        found = _COUNT_RANGE.fullmatch(value.strip())
        if not found:
            return f"must be {wanted}, got {show(value)}"
        least, most = int(found.group(1)), int(found.group(2))
        if least < low:
            return f"must start at {low} or more, got {show(value)}"
        if most > high:
            return f"must end at {high} or less, got {show(value)}"
        if least > most:
            return f"must be MIN-MAX with MIN below MAX, got {show(value)}"
        return None

    return typed(f"whole number, {low} to {high}, or a range MIN-MAX", check)


def count_range(value: Any) -> Tuple[int, int]:
    """(MIN, MAX) of a value `count_or_range` accepted: N is (N, N), ``2-4`` is (2, 4), ``3-3`` is (3, 3)."""
    found = _COUNT_RANGE.fullmatch(value.strip()) if isinstance(value, str) else None
    if found:
        return int(found.group(1)), int(found.group(2))
    return int(value), int(value)


def number(low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False) -> Checker:
    below = "greater than" if low_open else "at least"
    above = "less than" if high_open else "at most"

    def check(value: Any) -> Problem:
        if not _is_number(value):
            return f"must be a finite number, got {show(value)}"
        if value < low or (low_open and value == low):
            return f"must be {below} {low}, got {show(value)}"
        if value > high or (high_open and value == high):
            return f"must be {above} {high}, got {show(value)}"
        return None

    lower = f"> {low:g}" if low_open else f">= {low:g}"
    upper = "" if high == math.inf else (f", < {high:g}" if high_open else f", <= {high:g}")
    return typed(f"number {lower}{upper}", check)


def auto_or(checker: Checker) -> Checker:
    """The word auto, or what `checker` accepts."""

    def check(value: Any) -> Problem:
        if value == "auto":
            return None
        problem = checker(value)
        return None if problem is None else f"{problem.replace(', got', ' or auto, got', 1)}"

    return typed(f"auto, or {type_text(checker)}", check)


def flag(value: Any) -> Problem:
    return None if isinstance(value, bool) else f"must be true or false, got {show(value)}"


def one_of(*choices: str, normalize: Callable[[str], str] = lambda s: s, ints: bool = False) -> Checker:
    def check(value: Any) -> Problem:
        if isinstance(value, str) or (ints and _is_int(value)):
            if normalize(str(value)) in choices:
                return None
        return f"must be one of {', '.join(choices)}, got {show(value)}"

    return typed("one of " + " | ".join(choices), check)


def text(
    pattern: str = "", what: str = "non-empty text", max_len: int = 4096, ints: bool = False, min_len: int = 1
) -> Checker:
    """A string (an int too where ``ints``: job_name=2024) matching ``pattern``; never control characters."""
    compiled = re.compile(pattern) if pattern else None

    def check(value: Any) -> Problem:
        if not (isinstance(value, str) or (ints and _is_int(value))):
            return f"must be {what}, got {show(value)}"
        word = str(value)
        if not min_len <= len(word) <= max_len:
            return f"must be {what} of {min_len} to {max_len} characters, got {show(value)}"
        if _CONTROL.search(word):
            return f"must be {what} without newlines or other control characters, got {show(value)}"
        if compiled is not None and word and not compiled.fullmatch(word):
            return f"must be {what}, got {show(value)}"
        return None

    return typed(what, check)


def slurm_time(value: Any) -> Problem:
    """Minutes or a Slurm time string, parsed by the same function that renders --time."""
    if isinstance(value, bool) or not (isinstance(value, (int, str))):
        return f"must be minutes or a Slurm time such as 01:30:00, got {show(value)}"
    try:
        minutes = limit_minutes(value)
    except ValueError:
        return (
            f"must be a positive number of minutes or a Slurm time (MM, MM:SS, HH:MM:SS, D-HH:MM:SS), got {show(value)}"
        )
    if minutes > MINUTES_PER_YEAR:
        return f"must be at most a year ({MINUTES_PER_YEAR} minutes), got {show(value)}"
    return None


def target_node(value: Any) -> Problem:
    if not isinstance(value, Mapping):
        return f"must be a config node with a _target_, got {show(value)}"
    target = value.get("_target_")
    if not isinstance(target, str) or not target.strip():
        return f"needs a _target_ naming a class or function, got _target_={show(target)}"
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", target):
        return f"_target_ must be a dotted Python name such as my_package.MyClass, got {show(target)}"
    return None


def name_or_target(*choices: str) -> Checker:
    """One of the built-in names, or a ``_target_`` node naming the user's own class or function."""
    names = one_of(*choices)

    def check(value: Any) -> Problem:
        if isinstance(value, Mapping):
            return target_node(value)
        if names(value) is None:
            return None
        return f"must be one of {', '.join(choices)} or a _target_ node, got {show(value)}"

    return typed(" | ".join(choices) + " | a _target_ node", check)


def regex_with_one_group(value: Any) -> Problem:
    if not isinstance(value, str):
        return f"must be a regular expression, got {show(value)}"
    try:
        groups = re.compile(value).groups
    except re.error as err:
        return f"is not a regular expression ({err}): {show(value)}"
    return None if groups == 1 else f"must have exactly one group (...), got {groups} in {show(value)}"


def list_of(item: Checker, what: str, allow_empty: bool = True) -> Checker:
    def check(value: Any) -> Problem:
        if not _is_list(value):
            return f"must be a list of {what}, got {show(value)}"
        if not allow_empty and len(value) == 0:
            return f"must be a non-empty list of {what}, got []"
        for index, element in enumerate(value):
            problem = item(element)
            if problem:
                return f"entry {index}: {problem}"
        return None

    return typed(f"list of {what}", check)


def balance(value: Any) -> Problem:
    if isinstance(value, str) and value in ("params", "time"):
        return None
    if _is_list(value) and len(value) > 0 and all(_is_int(c) and 1 <= c <= INT64_MAX for c in value):
        return None
    return f"must be params, time or a list of positive layer counts such as [5,10], got {show(value)}"


def split_point(value: Any) -> Problem:
    # Hydra reads `[2]` as a number: the module names of an nn.Sequential are digits.
    if _is_int(value) and value >= 0:
        return None
    return text(what="a module name")(value) if isinstance(value, str) else f"must be a module name, got {show(value)}"


def replicate(value: Any) -> Problem:
    if value == "nodes" or (_is_int(value) and value >= 1):
        return None
    return f"must be nodes or a positive whole number of replicas, got {show(value)}"


def qos_row(value: Any) -> Problem:
    if not isinstance(value, Mapping) or set(value.keys()) != {"max_minutes", "qos"}:
        return f"must be {{max_minutes: N, qos: name}}, got {show(value)}"
    return whole(1, MINUTES_PER_YEAR)(value["max_minutes"]) or SLURM_WORD(value["qos"])


def sbatch_options(value: Any) -> Problem:
    """cluster.extra: {option: value} rendered as `#SBATCH --option=value`; one line each, ASCII."""
    if not isinstance(value, Mapping):
        return f"must be a mapping of sbatch options such as {{exclusive: true, mail-type: END}}, got {show(value)}"
    for name in value.keys():
        if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name)):
            return f"has {show(name)}, which is not an sbatch option name (letters, digits, '-', '_')"
        option = value[name]
        if isinstance(option, bool) or _is_number(option):
            continue
        problem = (
            text(r"[ -~]+", "plain ASCII text")(option)
            if isinstance(option, str)
            else f"must be text, a number or true, got {show(option)}"
        )
        if problem:
            return f"option {show(name)} {problem}"
    return None


for _check, _what in (
    (flag, "true | false"),
    (slurm_time, "minutes or a Slurm time (HH:MM:SS)"),
    (target_node, "a _target_ node"),
    (regex_with_one_group, "a regular expression with one group"),
    (balance, "params | time | [layer counts]"),
    (split_point, "a module name"),
    (replicate, "nodes | a whole number >= 1"),
    (qos_row, "{max_minutes: N, qos: name}"),
    (sbatch_options, "{option: value}"),
):
    typed(_what, _check)


DECLARED_ONLY = typed("see the description", lambda value: None)  # a key checked elsewhere (named where declared)


SLURM_WORD = text(r"[A-Za-z0-9_.@:+-]+", "a Slurm name (ASCII letters, digits, '_', '.', '@', ':', '+', '-')", 255)
SLURM_WORDS = text(
    r"[A-Za-z0-9_.@:+-]+(,[A-Za-z0-9_.@:+-]+)*", "a Slurm name or a comma-separated list of names (ASCII)", 1024
)
PATH_TEXT = text(what="a path")


def _step_range(value: Any) -> Problem:
    """trainer.profile.steps: [first, last] global steps, 1 <= first <= last."""
    if _is_list(value) and len(value) == 2 and all(_is_int(v) and 1 <= v <= INT64_MAX for v in value):
        return None if value[0] <= value[1] else f"must list the first step before the last, got {show(list(value))}"
    return f"must be [first, last], two step numbers from 1 (inclusive), got {show(value)}"


step_range = typed("[first, last] steps", _step_range)


def _ranks_or_all(value: Any) -> Problem:
    """trainer.profile.ranks: rank numbers, or all."""
    if value == "all":
        return None
    if _is_list(value) and len(value) > 0 and all(_is_int(v) and 0 <= v <= INT64_MAX for v in value):
        return None
    return f"must be a non-empty list of rank numbers such as [0, 1], or all, got {show(value)}"


ranks_or_all = typed("list of ranks | all", _ranks_or_all)


def peak_table(precisions: Tuple[str, ...]) -> Checker:
    """cluster.gpu_peak_tflops: {precision: dense peak TFLOP/s per device}."""

    def check(value: Any) -> Problem:
        if not isinstance(value, Mapping) or not value:
            return f"must be a mapping of precision to TFLOP/s such as {{bf16: 989, tf32: 494}}, got {show(value)}"
        for name, tflops in value.items():
            if name not in precisions:
                return f"has {show(name)}, which is not one of the precisions {', '.join(precisions)}"
            if not _is_number(tflops) or tflops <= 0:
                return f"gives {name} {show(tflops)}: a peak is a positive number of TFLOP/s"
        return None

    return typed(f"mapping of {'|'.join(precisions)} to TFLOP/s", check)
