"""hpc_train's imports, read from its source: the login side imports in one direction, no module imports another in a
circle, and every function-level import says why."""

from tests.support.paths import SRC


def _imports_of(path, modules):
    """The hpc_train modules a file imports, at the top or inside a function."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hpc_train"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs or ({node.module} & modules)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & modules
    return found


def _modules_in_circles(paths):
    """The modules among `paths` that import themselves through the others (at the top or inside a function)."""
    files = {
        ".".join(path.relative_to(SRC).with_suffix("").parts): path for path in paths if path.name != "__init__.py"
    }
    graph = {name: _imports_of(path, set(files)) - {name} for name, path in files.items()}

    def reaches(start, goal, seen=()):
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, (*seen, nxt))) for nxt in graph[start])

    return sorted(name for name in graph if reaches(name, name))


def test_the_login_side_imports_in_one_direction():
    """No import circle among the login-side modules (hpc_train/*.py, hpc_train/config/ and hpc_train/launch/):
    plan -> config.engine, slurm -> plan, never back; each module can be read knowing only the ones below it."""
    login = [SRC / "hpc_train", SRC / "hpc_train" / "config", SRC / "hpc_train" / "launch"]
    circles = _modules_in_circles([path for folder in login for path in folder.rglob("*.py")])
    assert not circles, f"modules in an import circle: {circles}"


def test_no_module_of_hpc_train_imports_another_in_a_circle():
    """The whole package, compute side included, function-level imports included: no two modules need each other
    (a function-level import is for an optional or heavy dependency, never to hide a circle)."""
    circles = _modules_in_circles(list((SRC / "hpc_train").rglob("*.py")))
    assert not circles, f"modules in an import circle: {circles}"


def _unexplained_function_level_imports(path):
    """`file:line import` for each import inside a function of `path` with no comment saying why: on its own line,
    or on the line above the group of imports it belongs to."""
    import ast

    lines = path.read_text().splitlines()
    found = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            above = node.lineno - 2  # the line above, then up through the imports (and blank lines) of the same group
            while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith(("import ", "from "))):
                above -= 1
            said = "#" in lines[node.lineno - 1] or (above >= 0 and lines[above].strip().startswith("#"))
            if not said:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {lines[node.lineno - 1].strip()}")
    return sorted(set(found))


def test_every_function_level_import_says_why():
    """An import inside a function is for a heavy or optional dependency kept off a path that does not need it
    (torch off the login node, matplotlib until a figure is drawn, mlflow only with that logger): a one-line comment
    says which. Every other import goes at the top of the module, where a reader looks for it."""
    unexplained = [
        hit for path in sorted((SRC / "hpc_train").rglob("*.py")) for hit in _unexplained_function_level_imports(path)
    ]
    assert not unexplained, "function-level imports without a reason comment:\n" + "\n".join(unexplained)


# The layers as `ls` shows them, top first (the architecture page's package table): a module imports only modules of its
# own layer or of a layer below. hpc_train/__init__.py, the package's lazy front door, stands above them all.
LAYERS = (
    ("api", "cli", "connect", "steps", "models", "datasets", "tune"),
    ("report",),
    ("launch",),
    ("remote",),
    ("compute",),
    ("batchhost",),
    ("contracts",),
    ("containers",),
    ("config", "jobs", "pack"),
    ("records",),
    ("slurm", "processes", "conf", "hosts", "errors", "sizes"),
)
# Inside launch/, its three wings, top first: the Hydra side drives the backends, the backends run what planning made.
LAUNCH_LAYERS = (
    ("hydra",),
    ("backends",),
    ("planning",),
)
COMPUTE_LAYERS = (
    ("worker",),
    ("entry",),
    ("fit",),
    ("training",),
    ("parallel",),
    ("user",),
    ("checkpointing", "data", "models", "datasets", "performance", "replicas"),
    ("runtime", "settings"),
)


def _layer(module):
    """(layer, compute layer) of a dotted module name: lower numbers stand higher."""
    parts = module.split(".")[1:]
    top = next(i for i, names in enumerate(LAYERS) if parts[0] in names)
    inner = {"compute": COMPUTE_LAYERS, "launch": LAUNCH_LAYERS}.get(parts[0])
    if inner is None or len(parts) < 2:
        return top, -1
    return top, next(i for i, names in enumerate(inner) if parts[1] in names)


def test_every_import_goes_down_a_layer_or_stays_in_its_own():
    """No import back up a layer: each package of the table above can be read knowing only the ones below it (the
    rank's entry points above the trainer, training above parallel, the job records below the launcher)."""
    paths = [path for path in (SRC / "hpc_train").rglob("*.py") if path != SRC / "hpc_train" / "__init__.py"]
    files = {".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): path for path in paths}
    upward = []
    for name, path in sorted(files.items()):
        if name in ("hpc_train.compute",):
            continue
        here = _layer(name)
        for target in sorted(_imports_of(path, set(files))):
            there = _layer(target)
            same_package = here[0] == there[0]
            if (there[0] < here[0]) or (same_package and -1 < there[1] < here[1]):
                upward.append(f"{name} -> {target}")
    assert not upward, f"imports back up a layer: {upward}"
