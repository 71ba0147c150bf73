"""A first fit prints nothing a user cannot act on (issue 31, point 8).

`recipes fit -c configs/spiral_mlp.yaml` in an empty directory, as the README's first command runs it (no
``MLFLOW_TRACKING_URI``, no ``PYTHONWARNINGS``, the store created by this fit), in a subprocess: stdout and stderr
hold no Python warning, no library log record, no tip and no progress bar of an artifact copy. The noise loopwise
knows is filtered where it arises (``recipes/run/library_noise.py``, ``recipes/tracking/quiet_model_logging.py``);
a warning raised by the user's own code still prints, and loopwise's own warnings print as one ``recipes: warning:``
line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, recipes_env
from tests.mlflow_server import server  # noqa: F401  (server: the fixture)

SPIRAL = CONFIGS / "spiral_mlp.yaml"
EPOCHS = ("--trainer.max_epochs", "1")

#: the lines a fit may print on stderr: Lightning's seed and device lines, its reason for stopping, loopwise's own
#: notes (the logged model's URI); anything else there is counted
INFORMATIVE_STDERR = (
    r"Seed set to \d+$",
    r"[GTH]PU available: ",
    r"`Trainer\.fit` stopped: ",
    r"recipes: MLflow model models:/",
)
#: what a warning, a log record, a tip or a progress bar looks like on stdout
NOISE_ON_STDOUT = (
    r"^\S+:\d+: ",  # a Python warning (file:line: ...)
    r"\w*Warning\b",
    r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d [A-Z]+ ",  # MLflow's log format
    r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)[:\s]",
    r"^recipes: warning: ",
    r"Tip: ",
    r"Downloading artifacts|Uploading artifacts",
)


def fresh_fit(directory: Path, *args: str, env: dict[str, str] | None = None,
              config: Path = SPIRAL) -> subprocess.CompletedProcess:
    """`recipes fit -c <config: configs/spiral_mlp.yaml> <args>` in ``directory`` as a new user's shell runs it (with
    ``env`` added: a user's ``MLFLOW_TRACKING_URI``)."""
    added = env or {}
    env = recipes_env()
    env.pop("PYTHONWARNINGS", None)  # the test suite's setting; a user's shell has none
    for name in [k for k in env if k.startswith("MLFLOW_")]:
        env.pop(name)
    env.update(added)
    out = subprocess.run(
        [sys.executable, "-m", "recipes", "fit", "-c", str(config), *EPOCHS, *args],
        cwd=directory, env=env, capture_output=True, timeout=300,
    )
    # decoded here rather than with text=True, which turns a progress bar's carriage returns into new lines
    out.stdout, out.stderr = out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def unactionable(out: subprocess.CompletedProcess) -> list[str]:
    """The warnings, log records, tips and progress bars of a run's output, one entry each (a Python warning's echo of
    its source line belongs to the warning above it)."""
    found: list[str] = []
    for line in out.stderr.split("\n"):  # a progress bar redrawn with carriage returns is one line
        if not line.strip():
            continue
        if line[:1].isspace() and found and re.match(r"^\S+:\d+: ", found[-1]):
            continue  # "  warnings.warn(": the source line of the warning just counted
        if not any(re.match(p, line) for p in INFORMATIVE_STDERR):
            found.append(line)
    found += [line for line in out.stdout.split("\n") if any(re.search(p, line) for p in NOISE_ON_STDOUT)]
    return found


def test_a_fresh_spiral_fit_prints_no_warning(tmp_path):
    out = fresh_fit(tmp_path)
    assert "Training plan" in out.stdout and "LoopDoctor: no findings" in out.stdout  # the fit ran and said so
    assert (tmp_path / "mlflow.db").is_file()  # the store was new: its creation is part of the first fit
    noise = unactionable(out)
    assert len(noise) == 0, "a fresh fit printed:\n" + "\n".join(noise)


USER_MODEL = '''
import warnings

from lightning_modules.models import MLP


class NoisyMLP(MLP):
    """The user's network: it warns about its own input, and starts with logits 40 times too large."""

    def forward(self, x):
        warnings.warn("my model: this batch was not normalised", UserWarning)
        return 40 * super().forward(x)
'''


@pytest.mark.slow  # a second fresh fit
def test_a_warning_from_user_code_still_prints_and_loopwise_warnings_are_one_line(tmp_path):
    (tmp_path / "my_models.py").write_text(USER_MODEL)
    model = '{"class_path": "my_models.NoisyMLP", "init_args": {"hidden_sizes": [128, 128]}}'
    out = fresh_fit(tmp_path, "--model.init_args.model", model)  # `python -m` imports my_models from the directory
    noise = unactionable(out)
    user = [line for line in noise if "my model: this batch was not normalised" in line]
    # Python's format, path and all (printed again when MLflow runs the model on the input example)
    assert user and all(re.match(r".*my_models\.py:\d+: UserWarning: my model: this batch", u) for u in user), noise
    # loopwise's own warnings (the doctor's: the first loss is far above ln 3) are one line each, with no file path
    doctor = [line for line in noise if "LoopDoctor [" in line]
    assert any("LoopDoctor [initial_loss]: first-batch loss" in line for line in doctor), noise
    assert all(line.startswith("recipes: warning: LoopDoctor [") for line in doctor), noise
    assert not [line for line in noise if line not in user + doctor], noise  # nothing else


@pytest.mark.slow  # a real mlflow server and a fit in a subprocess
def test_a_fit_against_a_tracking_server_prints_no_library_line(tmp_path, server):  # noqa: F811
    """Issue 57, point 5: with ``MLFLOW_TRACKING_URI`` naming a running ``mlflow server`` (a team's set-up), the fit
    prints what the first fit prints and nothing more: no "Experiment ... not found. Creating it.", no artifact
    progress bar, no "View run ... at" line; the logged model's URI is loopwise's one line on stderr."""
    out = fresh_fit(tmp_path, env={"MLFLOW_TRACKING_URI": server.uri})
    assert "Training plan" in out.stdout and "LoopDoctor: no findings" in out.stdout
    assert not (tmp_path / "mlflow.db").exists()  # the server holds the record
    noise = unactionable(out)
    noise += [line for line in out.stdout.split("\n")
              if re.search(r"View run|View experiment|not found\. Creating", line)]
    assert len(noise) == 0, "a fit against a server printed:\n" + "\n".join(noise)


def test_a_fit_on_a_small_user_table_prints_no_warning(tmp_path):
    """Issue 57: a user's 150-row table has 7 batches an epoch at the recipe's automatic batch size, fewer than
    log_every_n_steps (10); Lightning's "smaller than the logging interval" warning printed on every such fit. The
    train metrics are logged per epoch all the same."""
    import pandas as pd
    from sklearn.datasets import load_iris

    frame = load_iris(as_frame=True).frame.rename(columns={"target": "species"})
    frame.to_csv(tmp_path / "iris.csv", index=False)
    out = fresh_fit(tmp_path, "--data.init_args.path", "iris.csv", "--data.init_args.target", "species",
                    config=CONFIGS / "tabular_mlp.yaml")
    assert "batches per epoch        7" in out.stdout
    assert "train/loss" in out.stdout.split("epoch 1/1")[1]  # the epoch's train metrics are there
    noise = unactionable(out)
    assert len(noise) == 0, "a small table's fit printed:\n" + "\n".join(noise)
    assert pd.read_csv(tmp_path / "iris.csv").shape == (150, 5)  # the user's file is as it was
