"""What a run was asked to do, in words: the config files and the command-line overrides of its command.

Two runs of one recipe differ by what was given on the command line (``--model.init_args.lr 0.003``); the run's
description (MLflow's ``mlflow.note.content``, shown on the run's page) and the tag ``loopwise.overrides`` say it, so
a teammate sees what differs without opening ``config.yaml``. Names drop jsonargparse's ``init_args`` level
(``model.lr=0.003``, ``model.model.hidden_sizes=[64]``); the tag keeps each override as given.
"""

from __future__ import annotations

from collections.abc import Sequence

OVERRIDES_TAG = "loopwise.overrides"
DESCRIPTION_TAG = "mlflow.note.content"  # MLflow's run description
CONFIG_FLAGS = ("-c", "--config")
SUBCOMMANDS = ("fit", "validate", "test", "predict")


def split_command_line(args: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``(config files, [(key, value), ...])`` of a recipe command's arguments (with or without the subcommand).

    ``--key value`` and ``--key=value`` both count; a flag with no value (``--key`` followed by another option or
    nothing) is ``(key, "true")``. ``-c``/``--config`` files are listed apart."""
    tokens = list(args)
    if tokens and tokens[0] in SUBCOMMANDS:
        tokens = tokens[1:]
    configs: list[str] = []
    overrides: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-"):
            i += 1
            continue
        key, has_value, value = token.partition("=")
        if not has_value:
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                value = tokens[i + 1]
                i += 1
            else:
                value = "true"
        i += 1
        if key in CONFIG_FLAGS:
            configs.append(value)
        else:
            overrides.append((key.lstrip("-"), value))
    return configs, overrides


def short_key(key: str) -> str:
    """A config key without jsonargparse's ``init_args`` levels: ``model.init_args.lr`` -> ``model.lr``."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def describe_command(stage: str, args: Sequence[str]) -> dict[str, str]:
    """The run's description and ``loopwise.overrides`` tags for a recipe command's arguments."""
    configs, overrides = split_command_line(args)
    files = " ".join(f"-c {c}" for c in configs)
    changed = ", ".join(f"{short_key(k)}={v}" for k, v in overrides)
    description = f"recipes {stage} {files}".rstrip() + (f"; overrides: {changed}" if changed else "; no overrides")
    return {
        OVERRIDES_TAG: " ".join(f"--{k}={v}" for k, v in overrides),
        DESCRIPTION_TAG: description,
    }
