"""MLflow tracking of the recipes: the logger, the tracking URI, the journal, ``recipes sync`` and the store helpers.

``recipes.tracking.RecipeLogger`` is the class path every ``config.yaml`` and ``best.yaml`` written by loopwise names
(``trainer.logger``), so these names stay importable from the package itself.
"""

from recipes.tracking.logger import CHECKPOINT_ARTIFACT_DIR, RecipeLogger, find_mlflow_logger
from recipes.tracking.uris import TrackingServerUnreachable, check_tracking_server, default_tracking_uri

__all__ = [
    "CHECKPOINT_ARTIFACT_DIR",
    "RecipeLogger",
    "TrackingServerUnreachable",
    "check_tracking_server",
    "default_tracking_uri",
    "find_mlflow_logger",
]
