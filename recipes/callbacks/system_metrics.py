"""MLflow's system metrics for a recipe run: CPU, memory, disk, network, and GPU utilization and memory.

Lightning's MLflow logger creates its run with the client, so MLflow's own switch (``log_system_metrics``, Lightning
issue 20563) never applies. ``SystemMetrics`` starts MLflow's ``SystemMetricsMonitor`` for the run when a command
starts (rank 0) and stops it at the end: ``system/cpu_utilization_percentage``, ``system/system_memory_usage_megabytes``,
``system/disk_usage_percentage``, ``system/network_receive_megabytes`` and, where a GPU and ``pynvml`` are present,
``system/gpu_0_utilization_percentage`` and ``system/gpu_0_memory_usage_megabytes``, one value per interval. The
monitor samples in its own thread; ``--system_metrics_interval 0`` turns it off.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from recipes.tracking.quiet_mlflow import SYSTEM_METRICS_MONITOR, quiet_info
from recipes.tracking.tracked_run import tracked_run


class SystemMetrics(Callback):
    """Record MLflow's system metrics for the run every ``interval`` seconds while the command runs.

    Args:
        interval: Seconds between samples (each sample is logged as one step of the ``system/*`` series).
    """

    def __init__(self, interval: float = 10.0) -> None:
        if interval <= 0:
            raise ValueError(f"SystemMetrics: interval must be > 0 seconds, got {interval}")
        self.interval = interval
        self.monitor: Any = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        run = tracked_run(trainer)
        if run is None or not trainer.is_global_zero or self.monitor is not None:
            return
        run_id = run.run_id
        if not run_id:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor  # noqa: PLC0415

        with quiet_info(*SYSTEM_METRICS_MONITOR):  # MLflow's started/stopped lines: nothing to act on
            # a resumed fit continues its series after the last logged step
            self.monitor = SystemMetricsMonitor(run_id, sampling_interval=self.interval, samples_before_logging=1,
                                                resume_logging=True, tracking_uri=run.tracking_uri)
            self.monitor.start()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.monitor is not None:
            with quiet_info(*SYSTEM_METRICS_MONITOR):
                self.monitor.finish()
            self.monitor = None


__all__ = ["SystemMetrics"]
