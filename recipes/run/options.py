"""The recipe's own options beside LightningCLI's (``--torch_threads``, ``--checkpoints_dir``, ...): what each does
is its help text, shown by ``recipes fit --help``."""

from __future__ import annotations

from typing import Literal

from lightning.pytorch.cli import LightningArgumentParser


def add_recipe_options(parser: LightningArgumentParser) -> None:
    """Add the options every recipe command takes."""
    parser.add_argument(
        "--early_stopping_patience",
        type=int | None,
        default=None,
        help="Stop training when the task's monitored metric has not improved for this many validations.",
    )
    parser.add_argument(
        "--float32_matmul_precision",
        type=Literal["highest", "high", "medium"] | None,
        default=None,
        help="torch.set_float32_matmul_precision for runs on CUDA ('high': TF32 tensor cores for float32 "
        "matmuls; set by configs/trainer/gpu-*.yaml). Ignored on CPU.",
    )
    parser.add_argument(
        "--torch_threads",
        type=int | None,
        default=None,
        help="torch.set_num_threads for this run (every process of it). CPU kernels split their sums across "
        "threads, so CPU results depend on the count: the recipes pin 2, so they give the same numbers on any "
        "machine. null: torch's default (one thread per core, or OMP_NUM_THREADS).",
    )
    parser.add_argument(
        "--checkpoints_dir",
        type=str,
        default="checkpoints",
        help="Root directory of checkpoints: <checkpoints_dir>/<experiment>/<run id>/{best,last}.ckpt.",
    )
    parser.add_argument(
        "--checkpoint_every_n_steps",
        type=int | None,
        default=None,
        help="Also write last.ckpt every this many optimizer steps, in the middle of epochs (atomically, like every "
        "checkpoint), so a hard kill loses at most that many steps; `--ckpt_path last` resumes from there exactly. "
        "null: last.ckpt after every validation (and on SIGTERM/Ctrl+C) only.",
    )
    parser.add_argument(
        "--allow_data_change",
        type=bool,
        default=False,
        help="validate/test/predict a checkpoint although the data settings differ from the ones it was trained "
        "with (another seed, split or file: the evaluated rows may include training rows). Recorded as the run "
        "tag loopwise.allow_data_change.",
    )
    parser.add_argument(
        "--mlflow_model",
        type=bool,
        default=True,
        help="At the end of a finished fit, log the best checkpoint as an MLflow pyfunc model of the run "
        "(raw rows in, the columns of `recipes predict` out; `mlflow.pyfunc.load_model`, `mlflow models serve`).",
    )
    parser.add_argument(
        "--system_metrics_interval",
        type=float,
        default=10.0,
        help="Seconds between samples of MLflow's system metrics for the run (CPU, memory, disk, network; GPU "
        "utilization and memory where present), series system/*; 0 turns them off.",
    )
    parser.add_argument(
        "--register_model",
        type=str | None,
        default=None,
        help="Also register the fitted model as a new version of this name in the tracking store's Model "
        "Registry (models:/<name>/<version>).",
    )
    parser.add_argument(
        "--predictions_path",
        type=str | None,
        default=None,
        help="CSV file for `recipes predict` (default predictions/<experiment>-<time>.csv).",
    )
    parser.add_argument(
        "--test_after_fit",
        type=bool,
        default=False,
        help="`recipes fit` only: once the fit has finished (max_epochs or early stopping, not a stop by signal), "
        "test its best.ckpt on the test split in the same process, as `recipes test` with the same arguments and "
        "`--ckpt_path best` would: its own MLflow run, tagged with the fit run's id (loopwise.fit_run_id).",
    )
