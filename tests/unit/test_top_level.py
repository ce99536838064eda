"""The tracked top level of the repository is the design card's entries plus the ones the architecture page documents,
so a stray file committed at the top fails the suite. Read without git: the top level's entries, less what
.gitignore leaves out (a checkout also holds `.venv/`, `hpc_train.egg-info/`, `outputs/`, ...)."""

from __future__ import annotations

from tests.support import gitignore
from tests.support.paths import REPO

CARD = {"pyproject.toml", "README.md", "hpc_train", "conf", "sbatch", "notebooks", "tests"}
DOCUMENTED = {
    "benchmarks",
    "docs",
    "examples",
    "scripts",
    "hydra_plugins",
    ".ci",
    ".gitignore",
    "constraints.txt",
    "mkdocs.yml",
}
OPTIONAL = {".pre-commit-config.yaml"}  # allowed once there is one
NOT_CONTENT = {".git"}


def test_the_top_level_holds_the_card_and_the_documented_entries_only():
    entries = {p.name for p in REPO.iterdir() if p.name not in NOT_CONTENT and not gitignore.ignored(p)}
    stray = entries - CARD - DOCUMENTED - OPTIONAL
    assert not stray, f"unexpected entries at the repository's top level: {sorted(stray)}"
    assert CARD | DOCUMENTED <= entries, f"missing: {sorted(CARD | DOCUMENTED - entries)}"


def test_the_architecture_page_names_every_top_level_entry():
    page = (REPO / "docs" / "architecture.md").read_text()
    section = page.split("## The repository", 1)[1].split("\n## ", 1)[0]
    for name in sorted(CARD | DOCUMENTED):
        shown = f"`{name}/`" if (REPO / name).is_dir() else f"`{name}`"
        assert shown in section, f"docs/architecture.md's 'The repository' does not name {shown}"


def test_a_stray_file_is_caught_and_ignored_outputs_are_not(tmp_path):
    (tmp_path / ".gitignore").write_text("*.egg-info/\noutputs/\n/.whl/\n")
    for name in ("hpc_train.egg-info", "outputs", ".whl"):
        (tmp_path / name).mkdir()
    (tmp_path / "hat a checkout runs#").write_text("cut lines")
    (tmp_path / "outputs.txt").write_text("a file, not the ignored folder")
    left = {p.name for p in tmp_path.iterdir() if not gitignore.ignored(p, tmp_path)}
    assert left == {".gitignore", "hat a checkout runs#", "outputs.txt"}


def test_the_wheel_lists_every_package():
    """pyproject.toml names the packages a wheel carries (a flat layout, listed by hand): every folder of hpc_train
    with an __init__.py is there, or a wheel install lacks it (and Hydra's plugin scan fails on its import)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "hpc_train").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set(), (
        f"packages missing from pyproject.toml's [tool.setuptools] packages: {found - listed}"
    )
