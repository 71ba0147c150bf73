"""Reading back the data a run used: its MLflow dataset inputs by split.

Every recipe run logs its splits as dataset inputs (``recipes/tracking/dataset_inputs.py``, written by
``recipes.callbacks.data_inputs``): a name (``SpiralDataModule/train``), a digest of the split's content, and the
split as the context tag ``mlflow.data.context``. ``recipes compare`` reads them to say which runs saw the same data;
the logged model links each split's metrics to them.
"""

from __future__ import annotations

from typing import Any

#: the dataset input's tag naming its split (train, val, test, predict)
CONTEXT_TAG = "mlflow.data.context"


def data_record(run: Any) -> dict[str, tuple[str, str]]:
    """The run's dataset inputs by split: ``{split: (name, digest)}`` (empty when it logged none)."""
    inputs = getattr(getattr(run, "inputs", None), "dataset_inputs", None) or []
    record: dict[str, tuple[str, str]] = {}
    for item in inputs:
        tags = {tag.key: tag.value for tag in (item.tags or [])}
        dataset = item.dataset
        split = tags.get(CONTEXT_TAG) or dataset.name.rsplit("/", 1)[-1]
        record[split] = (dataset.name, dataset.digest)
    return record


__all__ = ["CONTEXT_TAG", "data_record"]
