"""Predictions: the CSV of ``recipes predict``, and the trained model as an MLflow pyfunc model."""
