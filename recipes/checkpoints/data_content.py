"""The data a checkpoint was trained on, by content: ``checkpoint["loopwise_data"]``.

Every checkpoint a ``fit`` writes carries ``{"source": <digest>, "splits": {"train": ..., "val": ..., "test": ...}}``,
the digests of the run's MLflow dataset inputs (``recipes.tracking.dataset_inputs``): ``source`` is the SHA-256 of
the source file's or folder's bytes (``None`` for a generated source such as ``SpiralDataModule``), each split's the
digest of its rows after the split and preprocessing. They are computed once when the fit starts (the dataset
inputs' records are reused, the file's digest is cached: a large file is read once per command).

The data guard (``recipes.checkpoints.data_guard``) compares an evaluation's source with ``source`` before anything
runs. After the data is set up, ``validate``/``test``/``predict`` (on a split) compare the split they evaluate with
the checkpoint's (a split of tensors; another dataset's digest is its source's and settings', compared already): the same source bytes and settings but another split content means the preprocessing code changed
since the checkpoint was written. That is said in one warning line and recorded as the run tag
``loopwise.split_content_changed`` (not refused: the rows can be the same, encoded otherwise); an evaluation that
the user allowed on other data (``--allow_data_change``) expects other splits and is not told again.

The callback that writes and compares them is ``recipes.callbacks.data_content.DataContent``.
"""

from __future__ import annotations

DATA_KEY = "loopwise_data"
SPLITS = ("train", "val", "test")
SPLIT_TAG = "loopwise.split_content_changed"


__all__ = ["DATA_KEY", "SPLITS", "SPLIT_TAG"]
