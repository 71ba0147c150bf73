"""The base LightningModule every loopwise task shares.

``Task`` owns what all tasks have in common: the injected network, the optimizer with two parameter groups, the
learning-rate schedule (built from the trainer's real number of optimizer steps), one torchmetrics collection per
stage, the monitored metric, and hyperparameters that let ``load_from_checkpoint`` rebuild the task. Subclasses add
only their loss, metrics and how a batch becomes (outputs, targets); ``recipe_contract`` lists what recipes ask of it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal

import torch
from lightning.pytorch import Callback, LightningModule
from torch import Tensor, nn
from torch.optim import Optimizer
from torchmetrics import MetricCollection

from lightning_modules.batches import to_channels_last
from lightning_modules.compat import is_compiled_in_place
from lightning_modules.fine_tuning.initial_weights import InitialWeightsSpec, WeightsReport
from lightning_modules.fine_tuning.settings import FineTuning
from lightning_modules.kept_signature import kept_signature
from lightning_modules.metrics.deferred_metric_updates import DeferredMetricUpdates
from lightning_modules.metrics.epoch_metric_state import TRAIN_METRIC_STATE, epoch_metric_state, restore_epoch_metric_state, start_train_epoch
from lightning_modules.metrics.evaluation_loss import MeanLoss
from lightning_modules.metrics.stage_metrics import stage_metrics
from lightning_modules.optim.gradient_clipping import clip_by_norm_measured, clips_by_norm_the_default_way, clips_under_a_grad_scaler
from lightning_modules.optim.optimizer_kernels import fused_where_supported, keep_kernel_on_load
from lightning_modules.optim.parameter_groups import apply_lr_factors
from lightning_modules.optim.plateau_step import PlateauStep, plateau_step_taken
from lightning_modules.optim.schedules import Constant, Plateau, Schedule, total_optimizer_steps
from lightning_modules.read_steps import is_last_evaluation_batch, train_metrics_read_now
from lightning_modules.step_output import StepOutput, initial_loss_wording

STAGES = ("train", "val", "test")
LOWER_IS_BETTER = ("loss", "error", "mae", "mse", "rmse", "perplexity")

#: ``optimizer``'s type: the parameter groups -> the optimizer; Lightning's ``cli.OptimizerCallable``, written here so
#: that importing a task imports neither Lightning's CLI nor jsonargparse
OptimizerCallable = Callable[[Iterable], Optimizer]


class Task(LightningModule):
    """Base of every loopwise task: network, optimizer, schedule, per-stage metrics and the monitored metric.

    Args:
        model: The network (any ``nn.Module``). In YAML: a ``class_path`` with ``init_args``.
        optimizer: A callable that builds the optimizer from parameter groups (default ``torch.optim.AdamW``).
            Biases and norm weights are put in a group with ``weight_decay=0``.
        schedule: Learning-rate schedule: ``WarmupCosine``, ``OneCycle``, ``Plateau`` or ``Constant`` (default).
        monitor: Metric that defines "best" for checkpoints, early stopping and ``Plateau``; default: the task's
            ``default_monitor`` (``val/acc`` for classification, ``val/loss`` for regression and language models).
        monitor_mode: "min" or "max" for ``monitor``; default: "min" for losses and errors, "max" otherwise.
        compile: Compile the network with ``torch.compile`` (in place: parameter names and checkpoints stay the
            same as without it, so compiled and plain checkpoints load into each other).
        channels_last: Keep the network's 4-D weights and 4-D floating-point input batches in channels-last memory
            format (faster convolutions with mixed precision on GPUs; results are the same). Other tensors and
            networks without 4-D weights are untouched.
        init_from: Initial weights of the network: a ``.ckpt`` (a loopwise run's, or any Lightning checkpoint), a
            state-dict file (``.pt``, ``.safetensors``), or ``mlflow:<run id>/best|last`` (``recipes`` fetches it);
            a file name, or ``{path, strip_prefix, add_prefix, into, exclude, strict}`` (in Python also an
            ``InitialWeights``). Only ever read as weights (never as a config), when a run starts that restores no
            checkpoint; a mismatch, integer weights or a NaN is an error naming them. The report: ``weights_report``.
        freeze: Module name patterns of the network to freeze (``fnmatch``; "features" also names everything under
            it). Frozen norm layers stay in eval mode. Lightning's ``BaseFinetuning`` does the freezing.
        unfreeze_at_epoch: When frozen parts train: never (``None``), all from one epoch on (an int, 0-based), or
            per pattern ({"blocks.3": 2, "blocks.2": 4}, gradual; a pattern left out stays frozen).
        lr_multipliers: Parameter name pattern -> factor of the learning rate ({"features": 0.1}); first match wins.
        layerwise_lr_decay: Factor per block, from the top, of the network's stack of blocks (0.75: the last block
            trains at 0.75x, the one below at 0.56x, the embeddings at 0.75**(n+1)x; the head at 1x).

    On CUDA and the CPU the optimizer is built with ``fused=True`` (AdamW's step 3-5x faster on a CPU) when its class
    supports it (Adam, AdamW, SGD, Adagrad), the config leaves ``fused`` and ``foreach`` unset (``fused: false`` keeps
    the default) and no 16-mixed GradScaler must unscale for clipping.

    Every metric goes through ``self.log``: ``train/loss`` at every step (``on_step``; the callback metrics hold
    each batch's loss, the loggers get it every ``log_every_n_steps``; ``train_loss_steps`` can narrow it), not on
    the progress bar, whose values Lightning reads back to the host after every batch: a training step reads nothing
    back to the host. The
    train metrics' inputs are kept on the device and applied in one update at the epoch's or the run's last step
    (``DeferredMetricUpdates``); validation and test keep theirs until the last batch of each dataloader, so an
    evaluation batch reads nothing back either. The val and test loss is the plain loss (``evaluation_loss``: no
    label smoothing), a ``MeanLoss`` weighted by samples (or ``StepOutput.loss_weight``), so under DDP it is that of
    one process, like the other metrics. Clipping by norm keeps the norm it measures in ``gradient_norm``.
    """

    default_monitor: str = "val/loss"
    #: Constructor arguments that only steer ``predict`` (how to generate, say), not what the model learns: they are
    #: left out of the saved hyperparameters, so the values of the predict command (``--model.init_args.<name>``)
    #: or YAML apply to a checkpoint, which LightningCLI otherwise rebuilds from its own hyperparameters.
    prediction_options: ClassVar[tuple[str, ...]] = ()
    #: Which training batches log ``train/loss`` through ``self.log``: ``None`` (the default) every batch, so a
    #: callback reading ``trainer.callback_metrics["train/loss"]`` in ``on_train_batch_end`` sees each batch's loss;
    #: or a function of the trainer saying whether this batch's loss is read. ``recipes fit`` passes the steps whose
    #: values it reads (the loggers' ``log_every_n_steps``, the epoch's last batch, a stopping run): each ``self.log``
    #: call costs 0.2-0.6 ms of Lightning's bookkeeping on a CPU, a quarter of a small network's 1.5 ms step.
    train_loss_steps: Callable[[Any], bool] | None = None

    def __init__(
        self,
        model: nn.Module,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        schedule: Schedule | None = None,
        monitor: str | None = None,
        monitor_mode: Literal["min", "max"] | None = None,
        compile: bool = False,
        channels_last: bool = False,
        init_from: str | InitialWeightsSpec | None = None,
        freeze: list[str] | None = None,
        unfreeze_at_epoch: int | dict[str, int] | None = None,
        lr_multipliers: dict[str, float] | None = None,
        layerwise_lr_decay: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"{type(self).__name__}: model must be an nn.Module, got {type(model).__name__}")
        # plain values (sent to the trainer's loggers too); the network, optimizer and schedule only as the config's
        # class paths, when LightningCLI built the task (``built_from_config``)
        self.save_hyperparameters(ignore=[*self.prediction_options, "model", "optimizer", "schedule"])
        if self.built_from_config():  # the config's class paths of the network, optimizer and schedule too
            self.save_hyperparameters(ignore=list(self.prediction_options))
        self.model = model
        #: the fine-tuning arguments, checked against the network now (a pattern that names nothing is an error)
        self.fine_tuning = FineTuning(model, init_from, freeze, unfreeze_at_epoch, lr_multipliers, layerwise_lr_decay)
        self.optimizer = optimizer
        self.schedule = schedule if schedule is not None else Constant()
        self.monitor = monitor or self.default_monitor
        self.monitor_mode = monitor_mode or self.mode_for(self.monitor)
        self.compile_network = compile
        self._metrics_logged: dict[str, bool] = {}  # per stage: the metrics were logged this epoch
        self.channels_last = channels_last
        #: one collection per stage (``stage_metrics``: clones, evaluation-only metrics, no per-batch argument checks)
        metrics = stage_metrics(self.build_metrics(), self.build_eval_metrics())
        self.train_metrics, self.val_metrics, self.test_metrics = metrics
        #: the val and test loss, weighted by what each batch's loss is a mean over and summed over DDP ranks
        self.val_loss_metric, self.test_loss_metric = MeanLoss(), MeanLoss()
        #: per stage: the batches' (outputs, targets) kept on the device until the metrics are read
        self.metric_updates = {s: DeferredMetricUpdates(functools.partial(self.update_metrics, s)) for s in STAGES}
        #: the last optimizer step's total gradient norm before clipping, measured when clipping by norm; else ``None``
        self.gradient_norm: Tensor | None = None
        self._adopted_metrics: int | None = None  # id() of a subclass's ``metrics`` collection once adopted

    def built_from_config(self) -> bool:
        """Whether LightningCLI built this task from a parsed config (``recipes fit``, a user's own LightningCLI): its
        hyperparameters are then the config, class paths and plain values, with the ``_instantiator`` entry that
        LightningCLI records in every module's hyperparameters and checkpoint (``load_from_checkpoint`` rebuilds the
        network from them). Built in Python, the network, optimizer and schedule are objects that a weights-only
        checkpoint cannot hold: they are left out, and passed again when loading."""
        return "_instantiator" in self.hparams

    @staticmethod
    def mode_for(metric: str) -> Literal["min", "max"]:
        """"min" for losses and errors, "max" for scores such as accuracy."""
        return "min" if metric.rsplit("/", 1)[-1].lower().endswith(LOWER_IS_BETTER) else "max"

    # --- hooks for subclasses -------------------------------------------------------------------------------
    def build_metrics(self) -> MetricCollection:
        """The task's metrics; cloned once per stage so train/val/test never share state."""
        raise NotImplementedError

    def build_eval_metrics(self) -> MetricCollection:
        """Metrics computed on val/test only (e.g. AUROC, which keeps every prediction of the epoch)."""
        return MetricCollection({})

    def forward_batch(self, batch: Any) -> StepOutput:
        """Run the network on a batch and compute the loss."""
        raise NotImplementedError

    def metric_inputs(self, out: StepOutput) -> tuple[Tensor, Tensor]:
        """(preds, target) for the metric collection."""
        return out.outputs, out.targets

    def update_metrics(self, stage: str, outputs: Tensor, targets: Tensor) -> None:
        """Update the ``stage`` metrics with the (outputs, targets) of one or more batches, concatenated: called when
        the metrics are about to be read (``DeferredMetricUpdates``), not once per batch."""
        getattr(self, f"{stage}_metrics").update(*self.metric_inputs_of(outputs, targets))

    def metric_inputs_of(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """``metric_inputs`` of (outputs, targets) kept from one or more batches (no loss at hand)."""
        return self.metric_inputs(StepOutput(outputs.new_zeros(()), outputs, targets, len(outputs)))

    def evaluation_loss(self, out: StepOutput) -> Tensor:
        """A val/test batch's loss: the task's plain loss, without training-only terms (``train/loss`` keeps them)."""
        return out.loss

    @classmethod
    def data_mismatch(cls, datamodule: Any) -> str | None:
        """Why this task cannot learn from ``datamodule``'s kind of target (a classifier on a regression target, a
        regression on class labels), or ``None``. Checked at setup, and by ``recipes`` before the task is built."""
        return None

    def check_data(self, datamodule: Any) -> None:
        """Raise ``ValueError`` when the data module's description contradicts the task (called at setup)."""

    # --- what the loop doctor asks a task ------------------------------------------------------------------
    def expected_initial_loss(self) -> float | None:
        """The loss a freshly initialized network should have on its first batch, or ``None`` when there is none.

        The loop doctor's ``initial_loss`` check (``recipes.callbacks.LoopDoctor``) compares the first training
        batch's loss of a fresh run with this value and reports a large difference: an output layer initialized too
        large, labels that are not the classes the outputs stand for, or labels leaking into the inputs. Its hints
        speak of logits, labels and cross entropy. ``None`` skips the check.

        Default: ln(num_classes) for a task with ``task == "multiclass"`` and an int ``num_classes`` >= 2
        (``ClassificationModule``, or your own softmax classifier): the cross entropy of a uniform guess; ``None``
        otherwise (binary and multilabel BCE, regression). ``LanguageModelModule`` returns ln(vocab_size). Override
        it in your own task when its loss has another reference value (and ``explain_expected_initial_loss`` to say
        where it comes from).
        """
        classes = getattr(self, "num_classes", None)
        if getattr(self, "task", None) != "multiclass" or not isinstance(classes, int) or classes < 2:
            return None
        if self.fine_tuning.starts_pretrained:  # loaded weights: the first loss is no fresh network's
            return None
        return math.log(classes)

    def explain_expected_initial_loss(self, expected: float) -> str:
        """How the loop doctor's message words ``expected`` (the value of ``expected_initial_loss()``): it reads
        "first-batch loss 7.912 vs <these words> (tolerance 1.15): ...". Default: "ln(C) = 2.303 expected at
        initialization for C classes" when ``expected`` is ln(num_classes), else "2.303 expected at
        initialization" (``initial_loss_wording``)."""
        classes = getattr(self, "num_classes", None)
        return initial_loss_wording(expected, classes if isinstance(classes, int) else None, "classes")

    def prediction_columns(self, outputs: Tensor, datamodule: Any = None) -> dict[str, list[Any]] | None:
        """Readable columns for ``predict_step``'s outputs of all samples (one row per sample, in order), e.g.
        ``prediction`` and ``prob_<class>``; ``datamodule`` says what the outputs mean (class names, vocabulary).
        ``recipes predict`` writes them as the predictions CSV. ``None`` (the default): the raw outputs are written
        as ``output_0..k``."""
        return None

    def configured_schedule(self) -> Schedule | None:
        """The ``Schedule`` behind the LR scheduler that ``configure_optimizers`` returns, or ``None`` when a
        subclass overrides ``configure_optimizers`` (then ``schedule`` need not describe what runs).

        The loop doctor's ``schedule`` check reads its ``interval``: a per-step schedule must be stepped per step.
        """
        return self.schedule if type(self).configure_optimizers is Task.configure_optimizers else None

    # --- LightningModule ------------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        return self.model(*args, **kwargs)

    def run_model(self, inputs: Any) -> Tensor:
        """Call the network on tensor inputs or on a dict of named inputs (channels-last images when asked)."""
        if self.channels_last:
            # here rather than in on_after_batch_transfer, which a data module's own hook would silently replace
            inputs = to_channels_last(inputs)
        if isinstance(inputs, Mapping):
            return self.model(**inputs)
        return self.model(inputs)

    def setup(self, stage: str) -> None:
        self.adopt_own_metrics()
        trainer = self.attached_trainer()
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        if datamodule is not None:
            reason = self.data_mismatch(datamodule)
            if reason:
                raise ValueError(reason)
            self.check_data(datamodule)
        if self.channels_last:
            self.model.to(memory_format=torch.channels_last)  # 4-D parameters only; Lightning's .to keeps it
        if self.compile_network and not is_compiled_in_place(self.model):
            self.model.compile()

    def attached_trainer(self) -> Any | None:
        """The Trainer this task is attached to, or ``None`` (``self.trainer`` raises when there is none)."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    def adopt_own_metrics(self) -> None:
        """A subclass that sets ``self.metrics`` (a ``MetricCollection``) in its ``__init__`` gets those metrics per
        stage (``train/``, ``val/``, ``test/``; plus ``build_eval_metrics`` on val and test) instead of
        ``build_metrics``'s. Called at setup."""
        own = getattr(self, "metrics", None)
        if isinstance(own, MetricCollection) and id(own) != self._adopted_metrics:
            self.train_metrics, self.val_metrics, self.test_metrics = stage_metrics(own, self.build_eval_metrics())
            self._adopted_metrics = id(own)

    def load_initial_weights(self, path: str | None = None) -> WeightsReport | None:
        """Load ``init_from`` (or ``path``, a local copy of it) into the network now, once (a run's start calls it;
        a checkpoint's weights restored before count as loaded). Returns the ``weights_report``."""
        return self.fine_tuning.load_weights(path)

    @property
    def weights_report(self) -> WeightsReport | None:
        """What loading ``init_from`` did: keys loaded, missing, unexpected, of another shape (``None`` before)."""
        return self.fine_tuning.weights_report

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.fine_tuning.restored_from_checkpoint()  # the checkpoint's weights replace any initial ones
        if TRAIN_METRIC_STATE in checkpoint:  # the partial epoch's train metrics, or a finished one's (logged at start)
            restore_epoch_metric_state(self.train_metrics, checkpoint[TRAIN_METRIC_STATE], self.global_rank, checkpoint.get("global_step"))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[TRAIN_METRIC_STATE] = epoch_metric_state(self.train_metrics, self.metric_updates["train"])

    def configure_callbacks(self) -> list[Callback]:
        """The callbacks this configuration needs: fine-tuning's when parts are frozen, ``PlateauStep`` (plateau
        steps before the checkpoints) with a ``Plateau`` schedule or a subclass's own ``configure_optimizers``."""
        plateau = isinstance(self.configured_schedule(), Plateau) or self.configured_schedule() is None
        callbacks = (*self.fine_tuning.callbacks(), *([PlateauStep()] if plateau else []))
        return list(callbacks)

    def train(self, mode: bool = True) -> Task:
        super().train(mode)
        for layer in self.fine_tuning.frozen_norm_layers():  # frozen: pretrained running statistics, not the batch's
            layer.eval()
        return self

    def _shared_step(self, batch: Any, stage: str, batch_idx: int | None = None) -> StepOutput:
        out = self.forward_batch(batch)
        updates, trainer = self.metric_updates[stage], self.attached_trainer()
        updates.add(out.outputs, out.targets)
        if stage == "train":
            if train_metrics_read_now(trainer):  # the epoch's or the run's last step: its epoch values are read
                updates.flush()
            # every step (callbacks read it at each batch's end) unless train_loss_steps says otherwise; not on the
            # progress bar, whose value Lightning would read back to the host after every batch
            if self.train_loss_steps is None or trainer is None or self.train_loss_steps(trainer):
                self.log("train/loss", out.loss.detach(), on_step=True, on_epoch=False, batch_size=out.batch_size)
        else:
            if is_last_evaluation_batch(trainer, batch_idx):  # true outside a Trainer
                updates.flush()
            weight = out.batch_size if out.loss_weight is None else out.loss_weight
            getattr(self, f"{stage}_loss_metric").update(self.evaluation_loss(out), weight)
        if batch_idx == 0 or not self._metrics_logged.get(stage):
            # Metrics (the loss a Metric like the collection: synced over the ranks) go to self.log once per epoch and
            # loader, at batch_idx 0 or the first batch after the epoch-start hooks reset the flag (a resumed epoch);
            # Lightning keeps them, computes and resets them at the epoch's end.
            self._metrics_logged[stage] = True
            if stage != "train":
                loss = getattr(self, f"{stage}_loss_metric")
                self.log(f"{stage}/loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=out.batch_size)
            metrics: MetricCollection = getattr(self, f"{stage}_metrics")
            self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=stage == "val", batch_size=out.batch_size)
        return out

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.trainer.should_stop:  # set during this batch (a signal, a callback): the epoch ends here
            self.metric_updates["train"].flush()

    def on_validation_end(self) -> None:
        if self.trainer.state.fn == "fit" and self.trainer.should_stop:  # early stopping after a mid-epoch validation
            self.metric_updates["train"].flush()

    def on_train_epoch_end(self) -> None:
        self.metric_updates["train"].flush()

    def on_train_epoch_start(self) -> None:  # not called when a run resumes in the middle of the epoch
        self._metrics_logged["train"] = False
        self.metric_updates["train"].clear()  # steps of an epoch that ended without its end-of-epoch hooks (an
        start_train_epoch(self.train_metrics, self.loggers, self.global_step)  # exception); a restored epoch logged

    def on_validation_epoch_start(self) -> None:
        self._metrics_logged["val"] = False
        self.metric_updates["val"].clear()

    def on_test_epoch_start(self) -> None:
        self._metrics_logged["test"] = False
        self.metric_updates["test"].clear()

    def on_validation_epoch_end(self) -> None:
        self.metric_updates["val"].flush()

    def on_test_epoch_end(self) -> None:
        self.metric_updates["test"].flush()

    @kept_signature
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._shared_step(batch, "train", batch_idx).loss

    @kept_signature
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "val", batch_idx)

    @kept_signature
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._shared_step(batch, "test", batch_idx)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        if not plateau_step_taken(self.attached_trainer(), scheduler):  # PlateauStep took it before the checkpoints
            super().lr_scheduler_step(scheduler, metric)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip as Lightning does; clipping by norm keeps the total norm before clipping in ``gradient_norm`` (the
        loop doctor reads it instead of measuring every gradient a second time)."""
        self.gradient_norm = None
        if clips_by_norm_the_default_way(self.trainer, gradient_clip_val, gradient_clip_algorithm):
            self.gradient_norm = clip_by_norm_measured(self.trainer, optimizer, float(gradient_clip_val or 0))
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def clipping_measures_gradient_norm(self) -> bool:
        """Whether this task's clipping will measure the total gradient norm of the coming optimizer step (kept in
        ``gradient_norm``): clipping by norm the default way, and ``configure_gradient_clipping`` not overridden."""
        trainer = self.attached_trainer()
        if trainer is None or type(self).configure_gradient_clipping is not Task.configure_gradient_clipping:
            return False
        return clips_by_norm_the_default_way(trainer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)

    def configure_optimizers(self) -> Any:
        optimizer = apply_lr_factors(self.optimizer(self.fine_tuning.param_groups(self)))
        fuse = not clips_under_a_grad_scaler(self.attached_trainer())  # fp16 + clipping: Lightning unscales, then clips
        optimizer = keep_kernel_on_load(fused_where_supported(optimizer) if fuse else optimizer)  # not the checkpoint's
        total_steps = None
        if self.schedule.needs_total_steps:
            total_steps = total_optimizer_steps(self.trainer.estimated_stepping_batches, self.schedule)
        # a schedule watching its own metric (Plateau(monitor="val/loss") in a task that monitors val/auroc) gets that
        # metric's direction, not the task's
        watched = getattr(self.schedule, "monitor", None) or self.monitor
        mode = self.monitor_mode if watched == self.monitor else self.mode_for(watched)
        scheduler = self.schedule.build(optimizer, total_steps, watched, mode)
        if scheduler is None:
            return optimizer
        if scheduler.get("interval") == "epoch" and "monitor" in scheduler:
            # a metric-driven schedule can only step when validation has produced the metric
            scheduler["frequency"] = self.trainer.check_val_every_n_epoch or 1
        return {"optimizer": optimizer, "lr_scheduler": scheduler}
