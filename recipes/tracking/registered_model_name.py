"""The MLflow Model Registry's rule for a model's name, checked before training.

``--register_model NAME`` registers the fitted model as a new version of NAME at the end of a fit
(``recipes/predict/model_logging.py``); MLflow checks the name only then, after the whole training, so the recipe's
tracking configuration (``recipes/tracking/config.py``) checks it right after parsing instead.
"""

from __future__ import annotations

import posixpath

#: the Model Registry's name column (``registered_models.name``, VARCHAR(256))
REGISTERED_MODEL_NAME_MAX = 256


def check_registered_model_name(name: str | None) -> None:
    """``--register_model NAME`` follows the Model Registry's rule for names, checked before training instead of
    after it (MLflow checks them only when the model is registered, after the whole training): not empty, no '/' or
    ':', not '.' nor starting with '..' (MLflow's own rule); at most 256 characters (the registry's name column).
    ``ValueError`` naming the rule it breaks."""
    if name is None:
        return
    reason = None
    if not name.strip():
        reason = "it is empty"
    elif "/" in name or ":" in name:
        reason = "it contains '/' or ':' (models:/<name>/<version> URIs are split on them)"
    elif posixpath.normpath(name) != name or name == "." or name.startswith(".."):
        reason = "MLflow refuses '.' and names that start with '..' (it may store a name as a file)"
    elif len(name) > REGISTERED_MODEL_NAME_MAX:
        reason = f"it is {len(name)} characters long, more than the registry's {REGISTERED_MODEL_NAME_MAX}"
    if reason is not None:
        shown = name if len(name) <= 60 else f"{name[:60]}..."
        raise ValueError(
            f"--register_model {shown!r} is not a name the MLflow Model Registry accepts: {reason}; "
            "give a plain name such as 'churn' or 'spiral-mlp_v2' (or leave --register_model out)"
        )
