"""``recipes compare``: runs (or a sweep's trials) side by side, from the tracking store."""
