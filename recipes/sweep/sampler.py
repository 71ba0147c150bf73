"""The sampler of ``recipes sweep``: Optuna's TPE, seeded anew for every trial from the sweep's seed and its number.

The same command samples the same values, and several workers on one study sample different ones: trial ``n``
draws from ``TPESampler(seed=seed_everything + n)`` (unseeded when the recipe sets no seed), whichever worker asks
for it. The study is created (or loaded) with one ``TrialSeededSampler``; when a trial starts (``before_trial``) it
makes that trial's TPE sampler, which samples the trial's values and hears its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """``TPESampler(seed=seed + trial number)`` for every trial (``seed`` ``None``: unseeded).

    Args:
        seed: The recipe's ``seed_everything``, or ``None``.
    """

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.current = optuna.samplers.TPESampler(seed=seed)  # until the first trial starts

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """A trial starts: its own TPE sampler, seeded from its number."""
        self.current = optuna.samplers.TPESampler(seed=None if self.seed is None else self.seed + trial.number)
        self.current.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        """The current trial's TPE sampler's."""
        return self.current.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """The current trial's TPE sampler's."""
        return self.current.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        """The current trial's TPE sampler's."""
        return self.current.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        """The current trial's TPE sampler's."""
        self.current.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """The current trial's TPE sampler's."""
        self.current.reseed_rng()


__all__ = ["TrialSeededSampler"]
