"""``recipes sweep``: an Optuna study whose trials are recipe fits, nested under one MLflow parent run."""
