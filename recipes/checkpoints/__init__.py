"""Checkpoints: the files (read weights-only), the class paths they name, the choice of ``best``/``last``, atomic
writes, the ``--ckpt_path`` locations, ``RunCheckpoint``, the run stamp, the resume lock and the data guard."""
