"""The reference pages' generated parts, written into the repository from the key declarations and the shipped YAML.

    .venv/bin/python scripts/reference_pages.py           # rewrite them (after changing a declaration or conf/)
    .venv/bin/python scripts/reference_pages.py --check   # exit 1, naming each page that differs

Three pages: ``docs/reference/config.md`` (every option of every group with its values, then every declared key
with what a config that leaves it out runs with), the table of config groups in ``docs/reference/cli.md`` (the
groups and options ``hpc-train --help`` lists: the folders and files of the shipped ``conf/``) and the tree of
errors in ``docs/reference/api.md`` (``hpc_train.errors``' classes, each family's exit code from
``hpc_train.launch.hydra.exits``). Each page keeps its own words above its line ``BEGIN`` (``BEGINS``); everything
from that line on is this script's, up to the page's next heading of the same level (config.md: to its end). A unit test
(``tests/unit/test_reference_pages.py``) fails when a page in the repository and this script's text differ, so a
reader on GitHub or in a checkout sees what the declarations say.

Every key is declared once, in ``hpc_train.config.RULES`` (type, range, default when left
out, what null means, a one-line doc; the shipped ``_target_`` s' arguments in ``config.targets.TARGET_ARGS``):
the type and description columns come from there. Each option's own values come from its YAML
file (conf/: config.yaml and <group>/<option>.yaml), read with a small line
parser; the file's header comment describes the option, and a key's YAML comment is shown only
where no declaration exists (Hydra's own keys):

* the comment block at the top of a file describes the option;
* ``key: value   # comment`` documents ``key``; a comment-only line indented to the same column
  as the comment above it continues that comment;
* a block of comment-only lines between keys documents the key that follows it.

Nested mappings give dotted keys (``data.train._target_``); a block list (``setup:`` followed by
``- item`` lines) is shown as one flow list.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

from hpc_train import errors
from hpc_train.config import RULES
from hpc_train.config.checks import type_text
from hpc_train.config.targets import TARGET_ARGS
from hpc_train.launch.hydra import exits

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
COMMAND = ".venv/bin/python scripts/reference_pages.py"
BEGIN = f"<!-- generated from hpc_train/config/ and conf/ by `{COMMAND}`: edit those, not the text below -->"
ERRORS_BEGIN = (
    f"<!-- generated from hpc_train/errors.py and hpc_train/launch/hydra/exits.py by `{COMMAND}`: edit those, not the"
    " text below -->"
)

KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*|\"[^\"]*\"|'[^']*'):(?:\s+(?P<rest>.*)|\s*)$")
ITEM = re.compile(r"^(?P<indent> *)- (?P<rest>.*)$")


def split_comment(text: str) -> tuple[str, str, int]:
    """(value, comment, column of '#' in text or -1): a '#' outside quotes after a space."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip(), text[i + 1 :].strip(), i
    return text.rstrip(), "", -1


def parse(path: Path) -> tuple[str, list[dict]]:
    """(the file's header comment, its keys in order: path, value, doc)."""
    header: list[str] = []
    entries: list[dict] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    pending: list[str] = []  # comment lines waiting for the next key
    last = None  # the entry the previous line belonged to
    last_col = -1  # column of its inline comment
    block_indent = None  # inside a block scalar (key: |) deeper than this indent
    seen_key = False
    for raw in path.read_text().splitlines():
        if block_indent is not None:
            if not raw.strip() or len(raw) - len(raw.lstrip(" ")) > block_indent:
                continue
            block_indent = None
        stripped = raw.strip()
        if not stripped:
            last_col = -1
            continue
        if stripped.startswith("#"):
            col = raw.index("#")
            text = stripped[1:]
            if not seen_key:
                header.append(text)
            elif last is not None and col > 0 and col == last_col:
                last["doc"].append(text.strip())
            else:
                pending.append(text.strip())
                last_col = -1
            continue
        item = ITEM.match(raw)
        if item and last is not None and last["list"] is not None:
            value, comment, _ = split_comment(item.group("rest"))
            last["list"].append((value, comment))
            continue
        m = KEY.match(raw)
        if not m:
            continue
        seen_key = True
        indent = len(m.group("indent"))
        key = m.group("key").strip("\"'")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        value, comment, col = split_comment(m.group("rest") or "")
        full = ".".join([k for _, k in stack] + [key])
        entry = {"path": full, "value": value, "doc": pending + ([comment] if comment else []), "list": None}
        pending = []
        if value in ("|", ">", "|-", ">-"):
            entry["value"] = "(a block of text)"
            block_indent = indent
        elif value == "":
            entry["list"] = []  # a block list or a nested mapping follows
            stack.append((indent, key))
        entries.append(entry)
        last = entry
        last_col = len(raw) - len(m.group("rest") or "") + col if col >= 0 else -1
    # A key with neither a value nor list items is a mapping: its children carry the values.
    shown = []
    for e in entries:
        if e["list"]:
            e["value"] = "[" + ", ".join(v for v, _ in e["list"]) + "]"
        elif e["list"] is not None:
            if not e["doc"]:
                continue
            e["value"] = ""
        shown.append(e)
    return " ".join(h.strip() if not h.startswith("   ") else f"`{h.strip()}`" for h in header), shown


def text(s: str) -> str:
    """Comment text as Markdown table-cell text: code spans kept, the rest escaped."""
    parts = s.split("`")
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # inside backticks
            out.append("`" + part.replace("|", "\\|") + "`")
        else:
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            part = re.sub(r"([\\*_\[\]|])", r"\\\1", part)
            out.append(part)
    if len(parts) % 2 == 0:  # an unmatched backtick: keep it literal
        out[-1] = out[-1].replace("`", "\\`", 1)
    return "".join(out)


def code(value: str) -> str:
    if not value:
        return ""
    value = value.replace("|", "\\|")
    return f"`` {value} ``" if "`" in value else f"`{value}`"


def declaration(key: str, target: str = "") -> tuple[str, str]:
    """(type, doc) of a dotted key: its rule, the argument of the shipped `target` it belongs to, or nothing."""
    parts = key.split(".")
    for rule in RULES:
        pattern = rule.key.split(".")
        if len(pattern) == len(parts) and all(p in ("*", q) for p, q in zip(pattern, parts)):
            return type_text(rule.check), rule.doc
    args = TARGET_ARGS.get(target, {})
    if parts[-1] in args:
        check, _, doc = args[parts[-1]]
        return type_text(check), doc
    if parts[-1] == "_target_":
        return "a dotted Python name", "The class or function this node builds; its other keys are the arguments."
    return "", ""


def table(prefix: str, entries: list[dict]) -> list[str]:
    rows = ["| key | value | type | what it is |", "|---|---|---|---|"]
    targets: dict[str, str] = {}  # node path -> its _target_, for the arguments below it
    for e in entries:
        path = f"{prefix}{e['path']}"
        if path.endswith("._target_"):
            targets[path.rsplit(".", 1)[0]] = e["value"]
        kind, doc = declaration(path, targets.get(path.rsplit(".", 1)[0], ""))
        doc = doc or " ".join(e["doc"])
        rows.append(f"| `{path}` | {code(e['value'])} | {text(kind)} | {text(doc)} |")
    return rows


def every_key() -> list[str]:
    """One row per declared key: what a config that leaves it out runs with, and what null means."""
    rows = [
        "## Every key",
        "",
        "Each key as `hpc_train/config/` declares it (one module per group). *Left out*: what a job runs with when its",
        "config has no such key (your own option may leave it out), or why nothing is filled in; *required*: it must"
        " be",
        "there.",
        "",
        "| key | type | left out | null | what it is |",
        "|---|---|---|---|---|",
    ]
    for rule in RULES:
        left_out = (
            "required" if rule.required else (code(repr(rule.default)) if rule.has_default else text(rule.left_out))
        )
        rows.append(
            f"| `{rule.key}` | {text(type_text(rule.check))} | {left_out} | {text(rule.null or '')} |"
            f" {text(rule.doc)} |"
        )
    return rows


def groups_table(link: str = "") -> tuple[list[str], list[str]]:
    """(the groups of config.yaml's defaults list, in order; their table: default, every option, what it is)."""
    _, entries = parse(CONF / "config.yaml")
    defaults = next(e for e in entries if e["path"] == "defaults")
    groups: list[str] = []
    lines = ["| group | default option | options | what it is |", "|---|---|---|---|"]
    for value, comment in defaults["list"]:
        m = re.match(r"^(override )?([\w/]+):\s*(.*)$", value)
        if not m or m.group(1):
            continue
        group, default = m.group(2), m.group(3)
        options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        groups.append(group)
        lines.append(
            f"| [`{group}`]({link}#{group}) | {code(default)} | {', '.join(f'`{o}`' for o in options)} |"
            f" {text(comment)} |"
        )
    return groups, lines


def reference() -> str:
    """docs/reference/config.md's generated part."""
    head, entries = parse(CONF / "config.yaml")
    groups, rows = groups_table()
    lines = [
        "## Groups and their defaults",
        "",
        "The defaults list of `config.yaml`: one option of each group is picked unless you name another "
        "(`hpc-train strategy=fsdp`).",
        "",
        *rows,
    ]
    lines += ["", "## Top-level keys", "", text(head), ""]
    top = [e for e in entries if e["path"] != "defaults" and not e["path"].startswith("hydra")]
    hydra = [e for e in entries if e["path"].startswith("hydra")]
    lines += table("", top) + ["", "Hydra's own keys as `config.yaml` sets them:", ""] + table("", hydra)
    for group in groups:
        lines += ["", f"## {group}", ""]
        for path in sorted((CONF / group).glob("*.yaml")):
            head, entries = parse(path)
            lines += [f"### {group}={path.stem}", "", f"`conf/{group}/{path.name}`", ""]
            if head:
                lines += [text(head), ""]
            inherited = next((e for e in entries if e["path"] == "defaults"), None)
            if inherited:
                parents = [v for v, _ in inherited["list"] if v != "_self_"]
                lines += [
                    f"Starts from {', '.join(f'`{group}={p}`' for p in parents)}; the keys below replace or add to"
                    " its keys.",
                    "",
                ]
            keys = [e for e in entries if e["path"] != "defaults"]
            if keys:
                lines += table(f"{group}.", keys)
            else:
                lines.append("No keys of its own.")
            lines.append("")
    lines += [""] + every_key()
    return "\n".join(lines) + "\n"


def cli_groups() -> str:
    """docs/reference/cli.md's generated part: the config groups, each option, and the top-level keys."""
    groups, rows = groups_table(link="config.md")
    top = ", ".join(f"`{rule.key}`" for rule in RULES if "." not in rule.key and rule.key not in groups)
    return "\n".join(
        [
            *rows,
            "",
            f"Top-level keys: {top}. Every key of every option, with its value, type and meaning:"
            " [Configuration](config.md).",
            "",
        ]
    )


def api_errors() -> str:
    """docs/reference/api.md's generated part: the tree of hpc_train's errors, what each family is (its docstring's
    first sentence) and what the `hpc-train` command exits with on it."""
    base = errors.HpcTrainError
    rows = [f"| `{base.__name__}` | {_first_sentence(base)} | |"]
    for family in exits.FAMILIES:
        code = "the job's own (`exit_code`)" if family.kind is errors.JobFailed else str(family.exit_code)
        rows.append(f"| `{family.kind.__name__}` | {_first_sentence(family.kind)} | {code} |")
    return "\n".join(
        [
            f"Every error hpc_train raises on purpose is an `hpc_train.{base.__name__}`, of one of these families"
            " (each importable from `hpc_train`):",
            "",
            "| class | what it is | `hpc-train` exits with |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


def _first_sentence(kind: type) -> str:
    text = " ".join((kind.__doc__ or "").split()).replace("``", "`")
    return re.split(r"[.:;] ", text)[0].rstrip(".") + "."


PAGES: Dict[str, Callable[[], str]] = {
    "docs/reference/config.md": reference,
    "docs/reference/cli.md": cli_groups,
    "docs/reference/api.md": api_errors,
}
BEGINS = {"docs/reference/api.md": ERRORS_BEGIN}  # each page's line; BEGIN for the others


def generated(page: str, current: str) -> str:
    """The page as it must be: its own words up to its BEGIN line, then this script's text up to the page's next
    heading of the same level or above (cli.md and api.md go on after it; config.md's part runs to its end)."""
    begin = BEGINS.get(page, BEGIN)
    if begin not in current:
        raise SystemExit(f"{page}: no line {begin!r}: put it where the generated text starts")
    before, after = current.split(begin, 1)
    rest = re.search(r"^## ", after, flags=re.M) if not page.endswith("config.md") else None
    tail = after[rest.start() :] if rest else ""
    return f"{before}{begin}\n\n{PAGES[page]()}" + (f"\n{tail}" if tail else "")


def main(argv: Optional[List[str]] = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = []
    for page in PAGES:
        path = ROOT / page
        current = path.read_text()
        wanted = generated(page, current)
        if wanted == current:
            continue
        stale.append(page)
        if check:
            diff = difflib.unified_diff(current.splitlines(), wanted.splitlines(), page, f"{page} (generated)", n=1)
            print("\n".join(list(diff)[:40]))
        else:
            path.write_text(wanted)
            print(f"rewrote {page}")
    if check and stale:
        print(f"{', '.join(stale)} differ(s) from the declarations; regenerate: {COMMAND}", file=sys.stderr)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
