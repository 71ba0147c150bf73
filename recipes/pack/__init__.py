"""``recipes pack <image folder> <out>``: an image folder packed into Parquet shards of its encoded image files.

``command`` (the options, the one-line errors, the summary), ``image_source`` (the folder's images, in the order
``ImageFolderDataModule`` lists them), ``out_folder`` (what may be written and replaced in ``<out>``),
``shard_writer`` (the shards, each under a temporary name until the whole pack is written) and ``progress`` (the
progress bar or a line per shard). ``datamodules.image_shards`` reads the shards.
"""
