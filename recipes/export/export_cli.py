"""``ExportCLI``: ``recipes export`` as ``recipes predict`` builds it (the recipe parsed, ``--ckpt_path`` resolved and
checked, the data settings guarded, the data module's state restored from the checkpoint, the checkpoint's weights
compared with the task and loaded), then the network is written with ``save_pretrained`` instead of predicting: no
trainer and no tracked run."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser

from recipes.checkpoints.files import check_state_dict_matches, load_checkpoint_weights_only
from recipes.export.pretrained_export import ExportError, check_export_dir, export_pretrained
from recipes.run.errors import RecipeInputError
from recipes.run.recipes_cli import RecipesCLI

ARGS_NOTE = r"LightningCLI's args parameter is intended to run from within Python"
CKPT_PATH_NEEDED = "export needs --ckpt_path best|last|run:<run id>/best|mlflow:<run id>/best|<file>"
EXPORT_DIR_HELP = "New (or empty) directory the fine-tuned network and its image processor or tokenizer are written to"


class ExportCLI(RecipesCLI):
    """``recipes export -c <recipe> --ckpt_path best|last|run:<id>/best|mlflow:<id>/best|<file> --export_dir DIR``.

    Args:
        args: The command line after ``export``.
    """

    def __init__(self, args: list[str]) -> None:
        self.export_dir: Path | None = None
        self.written: list[str] = []
        # `recipes export` hands LightningCLI its own `predict` command line: not the mistake Lightning warns about
        warnings.filterwarnings("ignore", message=ARGS_NOTE, category=Warning)
        super().__init__(args=["predict", *args], run=True)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--export_dir", type=str | None, default=None, help=EXPORT_DIR_HELP)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        given = {arg.split("=", 1)[0] for arg in self.command_args}
        if not given & {"--ckpt_path", "-h", "--help"}:  # before predict's own line, which names predict
            raise RecipeInputError(CKPT_PATH_NEEDED)
        super().parse_arguments(parser, args)
        cfg = self.subcommand_config
        if cfg is None:
            return
        if not cfg.get("export_dir"):
            raise RecipeInputError("export needs --export_dir DIR: the new directory to write the network to")
        if not cfg.get("ckpt_path"):
            raise RecipeInputError(CKPT_PATH_NEEDED)
        try:
            self.export_dir = check_export_dir(cfg.export_dir)
        except ExportError as err:
            raise RecipeInputError(str(err)) from None

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """No trainer: the checkpoint's weights go into the task here, and the network is written."""
        assert self.checkpoint is not None and self.export_dir is not None
        check_state_dict_matches(self.checkpoint.path, self.checkpoint.shapes, self.model)
        checkpoint = load_checkpoint_weights_only(self.checkpoint.path)
        self.model.on_load_checkpoint(checkpoint)
        self.model.load_state_dict(checkpoint["state_dict"], strict=bool(getattr(self.model, "strict_loading", True)))
        self.model.eval()
        self.data_sizes.restore(self.datamodule)  # the training preprocessing (a no-op when a size link did it)
        try:
            self.written = export_pretrained(self.model.model, self.datamodule, self.export_dir)
        except ExportError as err:
            raise RecipeInputError(str(err)) from None
        return None

    def after_instantiate_classes(self) -> None:
        """The export is done: nothing of ``predict`` runs."""
        self.subcommand = None
        print(f"recipes: exported {self.ckpt_path_given} to {self.export_dir} ({', '.join(self.written)})", flush=True)


__all__ = ["ExportCLI"]
