"""The parsed config is changed in one place (``RecipesCLI.apply_to_config``), and a run records both the
``--ckpt_path`` the user typed and the file it resolved to (issue 29, item 4)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, SPIRAL, mlflow_client, runs_of

TINY = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2", "--trainer.max_epochs", "1"]

# --- the run records what the user typed and what it resolved to ---------------------------------------------------


@pytest.mark.slow
def test_test_with_ckpt_path_best_records_best_and_the_resolved_file(workdir):
    from recipes.cli import main

    main(["fit", "-c", str(SPIRAL), *TINY, "--mlflow_model", "false"])
    (fit_run,) = runs_of(workdir, "spiral_mlp")
    assert "loopwise.ckpt_path_given" not in fit_run.data.tags  # no --ckpt_path, no tag
    main(["test", "-c", str(SPIRAL), "--ckpt_path", "best", "--trainer.limit_test_batches", "2"])
    test_run = runs_of(workdir, "spiral_mlp")[-1]
    best = workdir / "checkpoints" / "spiral_mlp" / fit_run.info.run_id / "best.ckpt"
    tags = test_run.data.tags
    assert tags["loopwise.stage"] == "test"
    assert tags["loopwise.ckpt_path_given"] == "best"  # what the user typed
    assert tags["loopwise.ckpt_path"] == str(best.resolve())  # the file it resolved to (as before)
    # the run's config.yaml names the file, as Lightning loaded it (unchanged)
    config_path = mlflow_client(workdir).download_artifacts(test_run.info.run_id, "config.yaml", str(workdir / "dl"))
    assert yaml.safe_load(Path(config_path).read_text())["ckpt_path"] == str(best.resolve())


# --- one module writes the parsed config ---------------------------------------------------------------------------

#: calls that change a mapping or a jsonargparse Namespace in place
MUTATING_METHODS = {"update", "pop", "popitem", "setdefault", "clear", "__setitem__", "__delitem__", "set_defaults"}
#: functions and properties that hand out (a part of) the parsed config
CONFIG_SOURCES = {"recipe_logger_config", "logger_config", "subcommand_config", "data_init_args_namespace"}
#: the one function allowed to write it
WRITER = ("recipes/run/recipes_cli.py", "apply_to_config")


def root_name(node: ast.AST) -> str | None:
    """The name an attribute/subscript/call chain starts from (``cfg`` of ``cfg.trainer["logger"].get("x")``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def reads_config(value: ast.AST, tainted: set[str]) -> bool:
    """Whether ``value`` is (a part of) the parsed config itself, not a copy or a value built from it: a tainted
    name, its member (attribute, subscript, ``.get(...)``), ``self.config``/``self.config_init`` or a source's
    result (``recipe_logger_config(cfg)``, ``self.subcommand_config``)."""
    if isinstance(value, ast.Name):
        return value.id in tainted
    if isinstance(value, ast.Attribute):
        if value.attr in CONFIG_SOURCES or (value.attr in ("config", "config_init") and root_name(value) == "self"):
            return True
        return reads_config(value.value, tainted)
    if isinstance(value, ast.Subscript):
        return reads_config(value.value, tainted)
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Name):
            return func.id in CONFIG_SOURCES
        if isinstance(func, ast.Attribute):
            return func.attr in CONFIG_SOURCES or (func.attr == "get" and reads_config(func.value, tainted))
        return False
    if isinstance(value, ast.BoolOp):
        return any(reads_config(v, tainted) for v in value.values)
    if isinstance(value, ast.IfExp):
        return reads_config(value.body, tainted) or reads_config(value.orelse, tainted)
    return False


def config_writes(tree: ast.AST) -> Iterator[tuple[str, int, str]]:
    """``(function, line, code)`` of every write into a parsed config in ``tree``: a subscript or attribute assigned
    on a name that holds (a part of) it, or a mutating call on one. A name holds it when it is a parameter annotated
    ``Namespace`` or assigned (a part of) it, not a copy (followed through the function)."""
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
        tainted = {a.arg for a in args if a.annotation is not None and "Namespace" in ast.unparse(a.annotation)}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and reads_config(node.value, tainted):
                tainted.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(func):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = list(node.targets)
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, (ast.Subscript, ast.Attribute)) and isinstance(part.ctx, (ast.Store, ast.Del)):
                        if reads_config(part.value, tainted):
                            yield func.name, node.lineno, ast.unparse(target)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in MUTATING_METHODS and reads_config(node.func.value, tainted):
                    yield func.name, node.lineno, ast.unparse(node)[:80]


def test_the_scan_finds_the_writes_this_issue_removed():
    """The old writes (cli.py:150, tracking_config.py:71/:92, run_continuity.py:75) are found by the scan."""
    old = '''
def parse_arguments(self, parser, args):
    cfg = self.subcommand_config
    cfg["ckpt_path"] = self.checkpoint.path

def configure_tracking(cfg: Namespace) -> None:
    logger = recipe_logger_config(cfg)
    logger["init_args.experiment_name"] = recipe_name(cfg)

def prepare_tracking(cfg: Namespace) -> None:
    cfg.trainer.logger = False

def continue_stamped_run(logger_config: Namespace, stamp) -> None:
    tags = dict(logger_config.get("init_args.tags") or {})
    tags.update({"a": "b"})
    logger_config["init_args.run_id"] = "x"
    logger_config.init_args.update(run_id="y")
'''
    found = {(name, code.split("(")[0]) for name, _, code in config_writes(ast.parse(old))}
    assert found == {
        ("parse_arguments", "cfg['ckpt_path']"),
        ("configure_tracking", "logger['init_args.experiment_name']"),
        ("prepare_tracking", "cfg.trainer.logger"),
        ("continue_stamped_run", "logger_config['init_args.run_id']"),
        ("continue_stamped_run", "logger_config.init_args.update"),
    }


def test_only_recipes_cli_apply_to_config_writes_the_parsed_config():
    writes = []
    for path in sorted((REPO / "recipes").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        for name, line, code in config_writes(ast.parse(path.read_text(encoding="utf-8"))):
            if (relative, name) != WRITER:
                writes.append(f"{relative}:{line} ({name}): {code}")
    assert not writes, "the parsed config is changed by RecipesCLI.apply_to_config only:\n" + "\n".join(writes)
    writer = ast.parse((REPO / WRITER[0]).read_text(encoding="utf-8"))
    assert any(name == WRITER[1] for name, _, _ in config_writes(writer))  # the scan sees the writer itself
