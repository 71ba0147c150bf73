"""Evaluation uses the split the model was trained against: changed data settings are an error unless allowed."""

from __future__ import annotations

import pytest

from recipes.cli import main
from recipes.checkpoints.data_guard import DataChange, DataSettingsChanged, data_changes, guard_data_settings
from tests.conftest import SPIRAL, runs_of

TINY = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
TRAINED = {
    "_class_path": "datamodules.SpiralDataModule",
    "n_samples": 2000,
    "seed": 4,
    "val_fraction": 0.2,
    "batch_size": 64,
    "num_workers": 0,
    "image_size": (8, 8),
    "_instantiator": "lightning.pytorch.cli.instantiate_module",
}


def test_data_changes_name_the_settings_that_change_the_rows():
    now = {"n_samples": 2000, "seed": 0, "val_fraction": 0.25, "batch_size": 8, "num_workers": 2, "image_size": [8, 8]}
    assert data_changes(TRAINED, now) == [DataChange("seed", 4, 0), DataChange("val_fraction", 0.2, 0.25)]
    # loader settings, bookkeeping keys, tuples vs lists and settings only one side has are not differences
    assert data_changes(TRAINED, {"seed": 4, "batch_size": 8, "image_size": [8, 8], "stratify": True}) == []
    assert data_changes(None, now) == [] and data_changes({}, now) == []


def test_guard_data_settings_is_for_evaluation_and_can_be_overridden():
    now = {"seed": 0}
    with pytest.raises(DataSettingsChanged, match=r"seed 4 in the checkpoint, 0 now.*--data\.init_args\.seed 4"):
        guard_data_settings("best.ckpt", "test", TRAINED, now, allow=False)
    assert guard_data_settings("best.ckpt", "fit", TRAINED, now, allow=False) == []
    assert guard_data_settings("best.ckpt", "predict", TRAINED, now, allow=True) == [DataChange("seed", 4, 0)]


@pytest.mark.slow
def test_a_model_trained_with_seed_4_is_not_tested_on_the_default_split(workdir, capsys):
    main(["fit", "-c", str(SPIRAL), *TINY, "--data.init_args.seed", "4"])
    (fit_run,) = runs_of(workdir, "spiral_mlp")
    last = workdir / "checkpoints" / "spiral_mlp" / fit_run.info.run_id / "last.ckpt"
    capsys.readouterr()

    # `last` looks only among runs on this data: it skips the seed-4 run and says so
    with pytest.raises(SystemExit) as stop:
        main(["test", "-c", str(SPIRAL), "--ckpt_path", "last"])
    assert stop.value.code == 2
    assert f"skipped 1 run(s) trained on other data (run {fit_run.info.run_id}: seed 4 vs 0)" in capsys.readouterr().err

    # an explicit checkpoint gets the guard
    for stage in ("test", "validate", "predict"):
        with pytest.raises(SystemExit) as stop:
            main([stage, "-c", str(SPIRAL), "--ckpt_path", str(last)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert "seed 4 in the checkpoint, 0 now" in err and "--data.init_args.seed 4" in err
        assert "--allow_data_change true" in err
    assert len(runs_of(workdir, "spiral_mlp")) == 1  # nothing ran, no run was made

    main(["test", "-c", str(SPIRAL), "--ckpt_path", "last", "--data.init_args.seed", "4"])  # `last` finds it now
    matching = runs_of(workdir, "spiral_mlp")[-1]
    assert matching.data.tags["loopwise.stage"] == "test" and "test/acc" in matching.data.metrics
    assert "loopwise.allow_data_change" not in matching.data.tags

    main(["test", "-c", str(SPIRAL), "--ckpt_path", str(last), "--allow_data_change", "true"])
    allowed = runs_of(workdir, "spiral_mlp")[-1]
    assert allowed.info.run_id != matching.info.run_id
    assert allowed.data.tags["loopwise.allow_data_change"] == "seed: 4 -> 0"
    assert "as allowed: seed: 4 -> 0" in capsys.readouterr().err
