"""The ``recipes`` command: LightningCLI recipes tracked in MLflow, with loopwise's run-level callbacks."""
