"""Trainer settings that Lightning accepts but that make a recipe do nothing, or not what it says."""

from __future__ import annotations

from jsonargparse import Namespace


def check_trainer_settings(cfg: Namespace, subcommand: str | None = None) -> None:
    """``ValueError`` naming the setting for ``max_epochs`` 0 or below -1 (-1 is Lightning's "no limit") and a
    ``gradient_clip_val`` of 0 or less (no clipping is ``null``, a negative value is meaningless), an
    ``accumulate_grad_batches`` below 1 (Lightning divides by it), a ``checkpoint_every_n_steps`` below 1, and
    ``enable_checkpointing: false`` for a ``fit`` (``subcommand``): the recipe's checkpoints are part of the run
    (Lightning's own error named a ``ModelCheckpoint`` the user never added)."""
    trainer = cfg.get("trainer") or Namespace()
    if subcommand == "fit" and trainer.get("enable_checkpointing") is False:
        raise ValueError(
            "trainer.enable_checkpointing is false: a recipe's fit keeps best.ckpt and last.ckpt under checkpoints_dir "
            "(the resume, --ckpt_path best|last and the MLflow model come from them); leave it out (true). To write "
            "last.ckpt more often, set checkpoint_every_n_steps"
        )
    max_epochs = trainer.get("max_epochs")
    if max_epochs is not None and (max_epochs == 0 or max_epochs < -1):
        raise ValueError(
            f"trainer.max_epochs is {max_epochs}: it must be at least 1, or -1 for no limit (then set "
            "trainer.max_steps or a stop); 0 would train nothing"
        )
    clip = trainer.get("gradient_clip_val")
    if clip is not None and clip <= 0:
        raise ValueError(
            f"trainer.gradient_clip_val is {float(clip)}: a clip value must be > 0 (e.g. 1.0); leave it out (null) for no "
            "clipping"
        )
    accumulate = trainer.get("accumulate_grad_batches")
    if accumulate is not None and accumulate < 1:
        raise ValueError(
            f"trainer.accumulate_grad_batches is {accumulate}: it must be at least 1 (the batches whose gradients "
            "make one optimizer step; 1 steps after every batch)"
        )
    every = cfg.get("checkpoint_every_n_steps")
    if every is not None and every < 1:
        raise ValueError(
            f"checkpoint_every_n_steps is {every}: it must be at least 1 (optimizer steps between two writes of "
            "last.ckpt); leave it out (null) to write last.ckpt after every validation only"
        )


__all__ = ["check_trainer_settings"]
