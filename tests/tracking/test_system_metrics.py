"""MLflow's system metrics are recorded for a recipe run at the chosen interval, and not at all with 0."""

from __future__ import annotations

import pytest

from recipes.cli import main
from tests.conftest import SPIRAL, mlflow_client, runs_of

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_system_metrics_every_interval_and_an_off_switch(workdir):
    long_enough = ["--trainer.max_epochs", "30", "--data.init_args.n_samples", "2000"]
    main(["fit", "-c", str(SPIRAL), *long_enough, "--system_metrics_interval", "0.25"])
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "2", "--system_metrics_interval", "0"])
    on, off = runs_of(workdir, "spiral_mlp")
    cpu = mlflow_client(workdir).get_metric_history(on.info.run_id, "system/cpu_utilization_percentage")
    assert len(cpu) >= 2 and all(0.0 <= m.value <= 100.0 for m in cpu)
    assert [m.step for m in cpu] == list(range(len(cpu)))
    assert {"system/system_memory_usage_megabytes", "system/disk_usage_percentage"} <= set(on.data.metrics)
    assert not any(k.startswith("system/") for k in off.data.metrics)
