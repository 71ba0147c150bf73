"""A recipe command leaves the process as it found it: the environment, MLflow's global tracking URI and torch's
process-wide switches.

A command changes process-wide settings on the user's behalf while it runs: Lightning's ``MLFlowLogger`` sets
MLflow's global tracking URI to the run's store (MLflow exports it as ``MLFLOW_TRACKING_URI``), ``deterministic: true``
turns on ``torch.use_deterministic_algorithms`` (and sets ``CUBLAS_WORKSPACE_CONFIG``), ``seed_everything`` exports
``PL_GLOBAL_SEED``, ``torch_threads`` sets torch's threads and ``OMP_NUM_THREADS``, ``float32_matmul_precision`` the
matmul precision, a DDP launch its rank variables. In a shell each command is its own process and none of this
matters; in a notebook or a script that calls ``recipes.cli.main`` twice, the second command read the first one's
tracking URI as the user's and logged into the first folder's store, and the user's own code ran on in deterministic
mode (where an operation without a deterministic kernel raises). ``process_settings_kept`` puts them back when the
command ends, however it ends. The random number generators are not put back: seeding them is what ``seed_everything``
is for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class TorchSwitches:
    """torch's process-wide switches that a run's settings change."""

    deterministic: bool
    deterministic_warn_only: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    float32_matmul_precision: str
    threads: int

    @classmethod
    def now(cls) -> TorchSwitches:
        import torch  # noqa: PLC0415 - a command that sets none of them imports no torch for them

        return cls(
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
            cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
            float32_matmul_precision=torch.get_float32_matmul_precision(),
            threads=torch.get_num_threads(),
        )

    def restore(self) -> None:
        import torch  # noqa: PLC0415

        if self != TorchSwitches.now():
            torch.use_deterministic_algorithms(self.deterministic, warn_only=self.deterministic_warn_only)
            torch.backends.cudnn.deterministic = self.cudnn_deterministic
            torch.backends.cudnn.benchmark = self.cudnn_benchmark
            torch.set_float32_matmul_precision(self.float32_matmul_precision)
            if torch.get_num_threads() != self.threads:
                torch.set_num_threads(self.threads)


def tracking_uri_set_in_process() -> str | None:
    """The tracking URI to put back after a command: the one ``mlflow.set_tracking_uri`` set in this process, or
    ``None`` when none was set or it is ``MLFLOW_TRACKING_URI``'s (then the environment decides, as before, and follows
    the variable when the user changes it). ``None`` when the command has not imported MLflow."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or not mlflow.is_tracking_uri_set():
        return None
    uri = mlflow.get_tracking_uri()
    return None if uri == os.environ.get("MLFLOW_TRACKING_URI") else uri


@contextmanager
def process_settings_kept(torch_switches: bool = True) -> Iterator[None]:
    """The environment (every variable, exactly), MLflow's global tracking URI and torch's process-wide switches
    (``TorchSwitches``) as they were before the block, whatever the block did to them. ``torch_switches=False``: a
    block that sets none of torch's switches (``recipes compare``, ``recipes --help``); they are kept only if the
    process had imported torch, so the block does not import it for them."""
    environment = dict(os.environ)
    tracking_uri = tracking_uri_set_in_process()
    switches = TorchSwitches.now() if torch_switches or "torch" in sys.modules else None
    try:
        yield
    finally:
        mlflow = sys.modules.get("mlflow")
        if mlflow is not None:  # None: no URI set in the process (MLflow's own way to unset it)
            mlflow.set_tracking_uri(tracking_uri)  # exports (or removes) MLFLOW_TRACKING_URI: the environment next
        for key in [key for key in os.environ if key not in environment]:
            del os.environ[key]
        for key, value in environment.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        if switches is not None:
            switches.restore()


__all__ = ["TorchSwitches", "process_settings_kept", "tracking_uri_set_in_process"]
