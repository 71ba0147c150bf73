"""What docs/ARCHITECTURE.md states about the code, checked: the rooms, the fence around Lightning's private names,
one way to write to MLflow from a callback, the layers of recipes/ and the import graph. (The page lists no files and
no test asks it to: a file's folder says where it lives; a concept is not split to meet a line cap.)"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    "package, forbidden",
    [("lightning_modules", {"recipes", "datamodules", "mlflow"}), ("datamodules", {"recipes", "lightning_modules", "mlflow"})],
)
def test_packages_do_not_import_their_neighbours(package, forbidden):
    for path in sorted((REPO / package).rglob("*.py")):
        bad = imported_packages(path) & forbidden
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_public_names_of_the_design_import():
    from datamodules import (  # noqa: F401
        CharLMDataModule,
        ImageFolderDataModule,
        SpiralDataModule,
        TextClassificationDataModule,
    )
    from datamodules.collate import pad_collate  # noqa: F401
    from datamodules.samplers import ClassBalancedSampler, LengthBucketBatchSampler  # noqa: F401
    from lightning_modules import ClassificationModule, LanguageModelModule, RegressionModule  # noqa: F401
    from lightning_modules.models import GPT, MLP, ConvNet, TransformerClassifier  # noqa: F401
    from lightning_modules.optim import Constant, OneCycle, Plateau, WarmupCosine  # noqa: F401
    from recipes.cli import main  # noqa: F401


# --- private names of other libraries only in the compat modules (ARCHITECTURE.md, "Lightning internals"): torch's in
# lightning_modules/compat.py, Lightning's in recipes/compat.py (the modules people import use Lightning's public API)
COMPAT = (REPO / "lightning_modules" / "compat.py", REPO / "recipes" / "compat" / "internals.py")
FENCED_PACKAGES = ("recipes", "datamodules", "lightning_modules", "benchmarks")
OWN_PACKAGES = {"recipes", "datamodules", "lightning_modules", "benchmarks"}


# namedtuple's documented API carries an underscore only to avoid clashing with field names
PUBLIC_DESPITE_UNDERSCORE = {"_fields", "_asdict", "_replace", "_make"}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_DESPITE_UNDERSCORE


def project_files() -> list[Path]:
    return [p for pkg in FENCED_PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]


def own_modules() -> set[str]:
    """Module names of the project's own files (benchmarks import ``_common`` as a top-level module)."""
    return {p.stem for p in project_files()}


def defined_private_names(node: ast.AST) -> set[str]:
    """Private names defined under ``node``: ``self._x = ...``, ``def _x``, ``_x = ...``."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and is_private(sub.name):
            names.add(sub.name)
        targets = []
        if isinstance(sub, ast.Assign):
            targets = sub.targets
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
            targets = [sub.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and is_private(part.attr):
                    names.add(part.attr)
                elif isinstance(part, ast.Name) and is_private(part.id):
                    names.add(part.id)
    return names


def project_classes(paths: list[Path]) -> dict[str, tuple[set[str], list[str]]]:
    """``{class name: (private names it defines, names of its bases)}`` for every class of the project."""
    classes = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
                classes[node.name] = (defined_private_names(node), bases)
    return classes


def own_names_of(class_name: str, classes: dict[str, tuple[set[str], list[str]]]) -> set[str]:
    """Private names a project class may use on ``self``: its own and those of its project base classes."""
    names, seen, todo = set(), set(), [class_name]
    while todo:
        name = todo.pop()
        if name in seen or name not in classes:
            continue
        seen.add(name)
        own, bases = classes[name]
        names |= own
        todo.extend(bases)
    return names


def private_uses(path: Path, classes: dict[str, tuple[set[str], list[str]]]) -> list[str]:
    """``file:line what`` for each use of another library's private name in ``path``: a private import, ``x._y`` on
    an object that is not ``self``/``cls``/``super()``, ``self._y`` where neither the class nor one of its project
    base classes defines ``_y``, and ``getattr(x, "_y")`` and kin."""
    found = []
    where = path.relative_to(REPO)
    tree = ast.parse(path.read_text())
    enclosing: dict[ast.AST, str] = {}
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef):
            for sub in ast.walk(cls):
                enclosing[sub] = cls.name  # inner classes overwrite: walk order visits them later
    module_names = defined_private_names(tree)
    for node in ast.walk(tree):
        allowed = own_names_of(enclosing[node], classes) if node in enclosing else set()
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in OWN_PACKAGES | own_modules():
                continue
            private_module = any(is_private(part) for part in node.module.split("."))
            for alias in node.names:
                if private_module or is_private(alias.name):
                    found.append(f"{where}:{node.lineno} from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            value = node.value
            ours = isinstance(value, ast.Name) and value.id in ("self", "cls")
            ours = ours or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super")
            if not ours or node.attr not in allowed:
                found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value):
                    target = node.args[0]
                    on_self = isinstance(target, ast.Name) and target.id in ("self", "cls")
                    if not (on_self and name.value in allowed | module_names):
                        found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_private_names_of_other_libraries_only_in_the_compat_module():
    files = project_files()
    classes = project_classes([p for p in files if p not in COMPAT])
    found = [use for path in files if path not in COMPAT for use in private_uses(path, classes)]
    assert not found, (
        "private names of Lightning/torch/MLflow outside lightning_modules/compat.py and recipes/compat/internals.py (add a "
        "function there, with a "
        "probe in tests/lightning_modules/test_compat.py):\n" + "\n".join(found)
    )


def test_the_private_name_scan_finds_what_it_should(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from lightning.fabric.utilities.types import _PATH\n"
        "class C:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def f(self, trainer):\n"
        "        trainer._signal_connector.received_sigterm = True\n"
        "        getattr(trainer, '_checkpoint_io', None)\n"
        "        return self._mine + self._initialized + super()._run_subcommand('fit')\n"
        "class D:\n"
        "    def g(self):\n"
        "        self._trainer = None\n"
        "class E(C):\n"
        "    def h(self):\n"
        "        return self._mine + self._trainer\n"
    )
    sample_in_repo = REPO / "tests" / "_private_name_scan_sample.py"
    sample_in_repo.write_text(sample.read_text())
    try:
        uses = [line.split(" ", 1)[1] for line in private_uses(sample_in_repo, project_classes([sample_in_repo]))]
    finally:
        sample_in_repo.unlink()
    assert sorted(uses) == sorted(
        [
            "from lightning.fabric.utilities.types import _PATH",
            "trainer._signal_connector",
            "getattr(trainer, '_checkpoint_io', None)",
            "self._initialized",
            "super()._run_subcommand",
            "self._trainer",
        ]
    )


# --- MLflow writes, the doctor's independence, the map's link ------------------------------------------------------
def test_only_the_tracking_modules_reach_into_the_mlflow_client():
    allowed = {REPO / "recipes" / "tracking" / "logger.py", REPO / "recipes" / "tracking" / "tracked_run.py"}
    found = []
    for path in sorted((REPO / "recipes").rglob("*.py")):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "experiment":
                owner = node.value
                name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
                if "logger" in name:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert not found, "write to MLflow through recipes.tracking.tracked_run.tracked_run(trainer):\n" + "\n".join(found)


def test_the_doctor_imports_no_concrete_task():
    tasks = {"lightning_modules.classification", "lightning_modules.regression", "lightning_modules.language_model"}
    found = []
    for path in sorted((REPO / "recipes" / "doctor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in tasks | {"lightning_modules"}:
                concrete = [a.name for a in node.names if a.name.endswith("Module")]
                if node.module in tasks or concrete:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} from {node.module}")
    assert (REPO / "recipes" / "doctor").is_dir()
    assert not found, "the doctor asks the task (Task.expected_initial_loss, ...), never a concrete class: " + str(found)


def test_the_readme_links_the_architecture_map():
    assert "docs/ARCHITECTURE.md" in (REPO / "README.md").read_text()


# --- the import graph: no circles, the layers docs/ARCHITECTURE.md states, no import from a package's __init__ ------
GRAPH_PACKAGES = ("recipes", "datamodules", "lightning_modules")
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
#: the top of recipes/ that is the command itself (layer ``cli``); every other top-level module is a shim that keeps
#: an old import path, which nothing in the packages may import
COMMAND_MODULES = {"recipes", "recipes.cli", "recipes.__main__"}
MAX_TOP_LEVEL_MODULES = 12


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in GRAPH_PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """``(imported project module, line)`` for every import in ``path``, at the top or inside a function or class
    (``ast.walk``: an import in a function body is a dependency all the same). ``from a.b import c`` is the module
    ``a.b.c`` when that is a module, else ``a.b``; relative imports are resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                module = ".".join(package + ([module] if module else []))
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    found.append((f"{module}.{alias.name}", node.lineno))
                elif module in modules:
                    found.append((module, node.lineno))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module: first line}}`` over recipes, datamodules and lightning_modules."""
    modules = project_modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        for target, line in imports_of(name, path, modules):
            if target != name:
                edges.setdefault(target, line)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle (``a -> b -> ... -> a``) for each group of modules that import each other (Tarjan's strongly
    connected components, then a shortest way back within the group)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # the graph is small (~130 modules): recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        todo = [start]
        while todo:  # breadth first within the group, back to start
            node = todo.pop(0)
            for target in sorted(graph[node]):
                if target == start:
                    found.append(paths[node] + [start])
                    todo = []
                    break
                if target in group and target not in paths:
                    paths[target] = paths[node] + [target]
                    todo.append(target)
    return sorted(found)


def described(graph: dict[str, dict[str, int]], circle: list[str]) -> str:
    modules = project_modules()
    steps = [f"{a} -> {b} ({modules[a].relative_to(REPO)}:{graph[a][b]})" for a, b in zip(circle, circle[1:])]
    return "\n  ".join(steps)


def test_no_circle_among_the_modules_counting_imports_inside_functions():
    graph = import_graph()
    found = circles(graph)
    assert not found, "modules that import each other (a function-level import counts):\n" + "\n".join(
        "  " + described(graph, circle) for circle in found
    )


def test_the_circle_finder_finds_a_circle_behind_a_function_level_import():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}, "e": {"e": 5}}
    assert circles(graph) == [["a", "b", "c", "a"]]
    modules = {"recipes.x": REPO / "x.py", "recipes.y": REPO / "y.py", "recipes": REPO / "recipes" / "__init__.py"}
    sample = REPO / "tests" / "_import_graph_sample.py"
    sample.write_text("def late():\n    from recipes import y\n    from . import x\n")
    try:
        found = imports_of("recipes.z", sample, modules)
    finally:
        sample.unlink()
    assert found == [("recipes.y", 2), ("recipes.x", 3)]


def stated_layers() -> list[list[str]]:
    """The package layers docs/ARCHITECTURE.md states on its ``layers:`` line, left (may import everything to its
    right) to right: ``layers: cli -> sweep -> run -> callbacks, predict -> ...``."""
    lines = [line.strip() for line in ARCHITECTURE.read_text().splitlines() if line.strip().startswith("layers:")]
    assert len(lines) == 1, "docs/ARCHITECTURE.md states the package layers on one line that starts with 'layers:'"
    return [[name.strip() for name in layer.split(",")] for layer in lines[0].removeprefix("layers:").split("->")]


def package_of(module: str) -> str | None:
    """The recipes package a module belongs to (``cli`` for the command at the top of recipes/, ``None`` for a
    shim at the top of recipes/ and for modules outside recipes)."""
    parts = module.split(".")
    if parts[0] != "recipes":
        return None
    if module in COMMAND_MODULES:
        return "cli"
    if len(parts) == 2 and not (REPO / "recipes" / parts[1]).is_dir():
        return None  # a shim
    return parts[1]


def shims() -> set[str]:
    return {m for m in project_modules() if m.startswith("recipes.") and m.count(".") == 1 and package_of(m) is None}


def test_the_stated_layers_name_every_package_of_recipes_once():
    named = [name for layer in stated_layers() for name in layer]
    packages = sorted(p.parent.name for p in (REPO / "recipes").glob("*/__init__.py")) + ["cli"]
    assert sorted(named) == sorted(packages), (
        "docs/ARCHITECTURE.md's 'layers:' line must name every package of recipes/ (and cli) exactly once: "
        f"named {sorted(named)}, packages {sorted(packages)}"
    )


def test_the_packages_import_only_to_their_right():
    rank = {name: i for i, layer in enumerate(stated_layers()) for name in layer}
    graph = import_graph()
    found = []
    for module, targets in sorted(graph.items()):
        here = package_of(module)
        for target, line in sorted(targets.items()):
            there = package_of(target)
            where = f"{project_modules()[module].relative_to(REPO)}:{line}"
            if target in shims():
                found.append(f"{where} imports the shim {target} (import the module it re-exports)")
            elif module.split(".")[0] != "recipes" and target.split(".")[0] != module.split(".")[0]:
                found.append(f"{where} imports {target} (datamodules and lightning_modules import neither recipes nor "
                             "each other)")
            elif here is None or there is None or here == there:
                continue
            elif here not in rank or there not in rank:
                continue  # the layer line's own test names them
            elif rank[there] <= rank[here]:
                found.append(f"{where}: {here} imports {there} ({target}); the layers allow only imports to the right")
    assert not found, "imports against docs/ARCHITECTURE.md's layers:\n" + "\n".join(found)


def test_no_module_imports_from_a_package_init():
    """Inside the packages, names come from the module that defines them: a package's ``__init__`` is the public
    surface for users (``recipes.callbacks``, ``recipes.tracking.RecipeLogger``), and importing it from inside pulls
    every module it re-exports and hides the real dependency. Only the package's own ``__init__`` imports its
    modules; ``import datamodules``/``lightning_modules`` (registering the classes by short name) is allowed."""
    modules = project_modules()
    found = []
    for module, targets in sorted(import_graph().items()):
        if module in shims():
            continue
        for target, line in sorted(targets.items()):
            init = modules[target].name == "__init__.py" and target.startswith("recipes.")
            own_modules = modules[module].name == "__init__.py" and target.startswith(module + ".")
            if init and not own_modules:
                found.append(f"{modules[module].relative_to(REPO)}:{line} imports the package {target}")
    assert not found, "import from the defining module, not from a package's __init__:\n" + "\n".join(found)


def test_at_most_12_modules_at_the_top_of_recipes():
    top = sorted(p.name for p in (REPO / "recipes").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top of recipes/ (concept folders): {top}"


# --- the written contract between recipes and the tasks and data modules (issue 29, point 3) ----------------------
# the names recipes/ gives a task or a data module it is handed
CONTRACT_RECEIVERS = {"datamodule", "data_module", "dm", "pl_module", "module", "task"}


def contract_members() -> set[str]:
    """Every member the two contract modules name: their Protocols' attributes and methods, and the data sizes."""
    import inspect

    import datamodules.recipe_contract as data_contract
    import lightning_modules.recipe_contract as task_contract

    names = set(data_contract.DATA_SIZES)
    for module in (data_contract, task_contract):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if getattr(cls, "_is_protocol", False) and cls.__module__ == module.__name__:
                names |= set(getattr(cls, "__annotations__", {}))
                names |= {name for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}
    return names


def test_no_getattr_probe_of_a_contract_member_in_recipes():
    """recipes/ asks a task or data module for a member of the contract through the contract's accessors
    (``data_size``, ``data_state_of``, ...), never ``getattr``/``hasattr`` with the member's name."""
    members = contract_members()
    assert {"image_size", "state_dict", "prediction_ids", "expected_initial_loss"} <= members
    found = []
    for path in sorted((REPO / "recipes").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in CONTRACT_RECEIVERS
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in members):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    accessors = "datamodules/recipe_contract.py or lightning_modules/recipe_contract.py"
    assert not found, f"use the contract's accessor ({accessors}):\n" + "\n".join(found)
