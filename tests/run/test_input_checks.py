"""One-line errors before anything runs (issue 16, items 5 and 6): settings that would do nothing or harm, files
that pandas would silently "fix", checkpoints with NaN weights, experiment names that leave the checkpoints dir."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from datamodules import TabularDataModule, TextClassificationDataModule
from recipes.cli import main
from tests.conftest import SPIRAL, runs_of


def one_line_error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("recipes: error: ")
    return line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--trainer.max_epochs", "0"], "trainer.max_epochs is 0: it must be at least 1, or -1 for no limit"),
        (["--trainer.max_epochs", "-3"], "trainer.max_epochs is -3"),
        (["--trainer.gradient_clip_val", "0"], "trainer.gradient_clip_val is 0.0: a clip value must be > 0"),
        (["--trainer.gradient_clip_val", "-1"], "trainer.gradient_clip_val is -1.0"),
        (["--trainer.logger.init_args.experiment_name", "../elsewhere"], "the experiment name '../elsewhere' is not a plain name"),
        (["--trainer.logger.init_args.experiment_name", "a/b"], "the experiment name 'a/b' is not a plain name"),
        (["--checkpoint_every_n_steps", "0"], "checkpoint_every_n_steps is 0: it must be at least 1"),
        (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches is 0: it must be at least 1"),
        (["--trainer.accumulate_grad_batches", "-2"], "trainer.accumulate_grad_batches is -2: it must be at least 1"),
        (["--model.init_args.optimizer.init_args.lr", "nan"],
         "model.init_args.optimizer.init_args.lr is nan: a learning rate must be a finite number, 0 or more"),
        (["--model.init_args.optimizer.init_args.lr=inf"], "model.init_args.optimizer.init_args.lr is inf: a learning"),
        (["--model.init_args.optimizer.init_args.lr", "-0.1"], "model.init_args.optimizer.init_args.lr is -0.1: a"),
        (["--trainer.enable_checkpointing", "false"],
         "trainer.enable_checkpointing is false: a recipe's fit keeps best.ckpt and last.ckpt under checkpoints_dir"),
    ],
    ids=["max_epochs_0", "max_epochs_negative", "clip_0", "clip_negative", "experiment_dotdot", "experiment_slash",
         "checkpoint_every_0_steps", "accumulate_0", "accumulate_negative", "lr_nan", "lr_inf", "lr_negative",
         "checkpointing_off"],
)
def test_settings_that_would_do_nothing_or_write_elsewhere_are_refused(workdir, capsys, extra, message):
    assert message in one_line_error(capsys, ["fit", "-c", str(SPIRAL), *extra])
    assert not (workdir / "checkpoints").exists() and not (workdir.parent / "elsewhere").exists()


@pytest.mark.parametrize("value", [".nan", ".inf", "-0.01"])
def test_a_learning_rate_in_a_config_file_that_is_not_a_positive_number_is_one_line(workdir, capsys, value):
    config = workdir / "lr.yaml"
    config.write_text(f"model:\n  init_args:\n    optimizer:\n      init_args:\n        lr: {value}\n")
    line = one_line_error(capsys, ["fit", "-c", str(SPIRAL), "-c", str(config)])
    assert "model.init_args.optimizer.init_args.lr is " in line and "a learning rate must be a finite number, 0 or more" in line
    assert not (workdir / "checkpoints").exists()


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path):
    table = tmp_path / "dup.csv"
    table.write_text("age,plan,age,label\n30,a,31,yes\n40,b,41,no\n")
    with pytest.raises(ValueError, match=r"names the column\(s\) \['age'\] more than once"):
        TabularDataModule(str(table), target="label").setup()
    texts = tmp_path / "dup_text.csv"
    texts.write_text("text,label,text\nhello,a,x\nbye,b,y\n")
    with pytest.raises(ValueError, match=r"names the field\(s\) \['text'\] more than once"):
        TextClassificationDataModule(str(texts)).setup()
    assert pd.read_csv(table).columns.tolist() == ["age", "plan", "age.1", "label"]  # what pandas would have done


@pytest.mark.parametrize("stage", ["validate", "test", "predict", "fit"])
def test_a_checkpoint_with_nan_weights_is_refused_by_every_command(workdir, capsys, stage):
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
          "--mlflow_model", "false"])  # fmt: skip
    (last,) = (workdir / "checkpoints" / "spiral_mlp").glob("*/last.ckpt")
    checkpoint = torch.load(last, weights_only=True)
    weight = next(k for k, v in checkpoint["state_dict"].items() if v.is_floating_point() and v.ndim == 2)
    checkpoint["state_dict"][weight].view(-1)[:3] = float("nan")
    doctored = workdir / "nan.ckpt"
    torch.save(checkpoint, doctored)
    runs = len(runs_of(workdir, "spiral_mlp"))
    line = one_line_error(capsys, [stage, "-c", str(SPIRAL), "--ckpt_path", str(doctored)])
    assert f"the weights are not finite: {weight} has 3 NaN/inf value(s)" in line
    assert len(runs_of(workdir, "spiral_mlp")) == runs  # nothing was made
