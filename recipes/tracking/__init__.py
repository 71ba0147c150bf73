"""MLflow tracking of the recipes: the logger, the tracking URI, the journal, ``recipes sync`` and the store helpers.

``recipes.tracking.RecipeLogger`` is the class path every ``config.yaml`` and ``best.yaml`` written by loopwise names
(``trainer.logger``), so these names stay importable from the package itself.

They are loaded on first use (PEP 562): ``RecipeLogger`` pulls in Lightning, and a process that needs only a store
helper (``recipes.tracking.sqlite_store``, ``recipes.tracking.uris``) would otherwise pay Lightning's whole import,
about 8 CPU seconds, for a name it never touches.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recipes.tracking.logger import CHECKPOINT_ARTIFACT_DIR, RecipeLogger, find_mlflow_logger
    from recipes.tracking.uris import TrackingServerUnreachable, check_tracking_server, default_tracking_uri

# public name -> the module that defines it
_DEFINED_IN = {
    "CHECKPOINT_ARTIFACT_DIR": "recipes.tracking.logger",
    "RecipeLogger": "recipes.tracking.logger",
    "find_mlflow_logger": "recipes.tracking.logger",
    "TrackingServerUnreachable": "recipes.tracking.uris",
    "check_tracking_server": "recipes.tracking.uris",
    "default_tracking_uri": "recipes.tracking.uris",
}

__all__ = sorted(_DEFINED_IN)


def __getattr__(name: str) -> Any:
    if name not in _DEFINED_IN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_DEFINED_IN[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
