"""``recipes predict`` output: the table of predictions (one row per sample), for the CSV that
``recipes.callbacks.prediction_csv_writer.PredictionCsvWriter`` writes and logs, and for the MLflow model."""

from __future__ import annotations

from typing import Any, Sequence

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import Tensor

from datamodules.recipe_contract import check_rows_of, id_name_of, prediction_ids_of, prediction_notes_of
from lightning_modules.recipe_contract import prediction_columns_of


def prediction_table(
    pl_module: Any,
    datamodule: Any,
    outputs: Tensor,
    ids: Sequence[Any] | None = None,
    notes: dict[str, list[Any]] | None = None,
) -> tuple[list[str], list[list[Any]]]:
    """Header and rows of the predictions CSV: the id column (the data module's ``id_name``, e.g. ``row`` or
    ``path``, with ``ids`` or else its ``prediction_ids``), then the task's ``prediction_columns``
    (``prediction``, ``prob_<class>``), or ``output_0..k`` for a task without them, then the data's notes on the
    rows (``notes`` or else its ``prediction_notes`` of the new data it read: ``unknown_categories`` of a table
    with categories the model was not trained on)."""
    columns = prediction_columns_of(pl_module, outputs, datamodule)
    if columns is None:
        width = outputs.shape[1]
        names = ["output"] if width == 1 else [f"output_{i}" for i in range(width)]
        columns = {name: outputs[:, i].tolist() for i, name in enumerate(names)}
    ids = prediction_ids_of(datamodule) if ids is None else list(ids)
    id_name = id_name_of(datamodule)
    if len(ids) != len(outputs):
        ids, id_name = list(range(len(outputs))), "row"
    notes = prediction_notes_of(datamodule) if notes is None else notes
    columns = {**columns, **{name: list(values) for name, values in notes.items() if len(values) == len(outputs)}}
    header = [id_name, *columns]
    rows = [list(row) for row in zip(ids, *columns.values())]
    return header, rows


def gather_in_sample_order(outputs: Tensor | None, batch_indices: Sequence[Any] | None) -> Tensor | None:
    """The prediction rows of all ranks, one per sample index, sorted by index (every rank gets the result).

    Args:
        outputs: This rank's rows, in the order of its batches (``None`` when it predicted nothing).
        batch_indices: The sample indices of this rank's batches as Lightning passes them to a prediction writer
            (one list of batches per dataloader, or one list of batches).
    """
    batches = batch_indices[0] if batch_indices and batch_indices[0] and isinstance(batch_indices[0][0], list) else (
        batch_indices or []
    )
    indices = [int(i) for batch in batches for i in batch]
    count = 0 if outputs is None else len(outputs)
    if len(indices) != count:
        raise RuntimeError(
            f"PredictionCsvWriter: this rank has {count} prediction rows but {len(indices)} sample indices, so the "
            "rows of the ranks cannot be put in order; predict on one device (leave out configs/trainer/ddp.yaml)"
        )
    shares: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shares, (indices, outputs))
    by_index: dict[int, Tensor] = {}
    for share_indices, share_outputs in shares:
        for position, index in enumerate(share_indices):
            by_index.setdefault(index, share_outputs[position])  # a sampler that pads repeats some samples
    if not by_index:
        return None
    return torch.stack([by_index[i] for i in sorted(by_index)])


@torch.no_grad()
def predict_frame(task: pl.LightningModule, datamodule: Any, frame: Any) -> Any:
    """The predictions table of raw rows without a Trainer (the MLflow model's ``predict``): the data module's
    ``check_rows`` refuses them naming every bad row and column, ``frame_data`` preprocesses them as at training
    time, the task's ``predict_step`` runs in eval mode batch by batch, and the columns are those of ``recipes
    predict``'s CSV (``unknown_categories`` included, when a row has one). Returns a pandas DataFrame."""
    import pandas as pd

    check_rows_of(datamodule, frame)
    dataset, ids = datamodule.frame_data(frame)
    loader = datamodule.inference_loader(dataset)
    was_training = task.training
    task.eval()
    try:
        device = next(task.parameters()).device
        batches = []
        for index, batch in enumerate(loader):
            batch = task.transfer_batch_to_device(batch, device, 0)
            out = torch.as_tensor(task.predict_step(batch, index)).detach().cpu()
            batches.append(out.reshape(len(out), -1))
    finally:
        task.train(was_training)
    outputs = torch.cat(batches) if batches else torch.empty(0, 1)
    header, rows = prediction_table(task, datamodule, outputs, ids, prediction_notes_of(datamodule, frame))
    return pd.DataFrame(rows, columns=header)
