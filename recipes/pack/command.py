"""``recipes pack <image folder> <out>``: an image folder as Parquet shards that ``ImageFolderDataModule`` reads.

Usage (dispatched by ``recipes pack ...``; ``main`` takes the arguments after ``pack``)::

    recipes pack data/flowers data/flowers_shards
    recipes pack data/flowers data/flowers_shards --shard_mb 64 --row_group_size 256 --overwrite

The image folder is read as the data module reads it (``recipes.pack.image_source``); every image is checked to open
as the module checks a file, and its bytes are stored as they are. Bad input (a folder that does not exist or has no
class folders, an image that does not open, an ``out`` that is a file or not empty) is one ``recipes pack: error:``
line and exit code 2; nothing is left in ``out`` then.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from recipes.pack.errors import PROG, PackError

DESCRIPTION = (
    "Pack an image folder (<image folder>/<class name>/...*.png|*.jpg|*.jpeg, as ImageFolderDataModule reads it) into "
    "Parquet shards out/part-00000.parquet, ... with one row per image: image (binary: the file's bytes as they are, "
    "not decoded), label (string: its class folder's name) and path (string: its path under the image folder, "
    "'/'-separated), in the data module's order (classes sorted, paths sorted within a class). "
    "ImageFolderDataModule(root=out) then trains on the same classes, split, statistics and pixels as on the folder. "
    "Each shard is written under a hidden temporary name and renamed once the whole pack is written."
)


def build_parser() -> Any:
    """The options of ``recipes pack``; a bad one raises jsonargparse's ``ArgumentError``."""
    from jsonargparse import ActionYesNo, ArgumentParser  # noqa: PLC0415

    parser = ArgumentParser(prog=PROG, description=DESCRIPTION, exit_on_error=False)
    parser.add_argument("image_folder", type=str,
                        help="The image folder: one sub-folder of images per class (nested folders belong to their "
                             "class; hidden files and folders are skipped).")
    parser.add_argument("out", type=str,
                        help="The folder the shards are written to: new or empty (see --overwrite); not inside the "
                             "image folder.")
    parser.add_argument("--shard_mb", "--shard-mb", type=float, default=256.0,
                        help="Image bytes per shard, in MB (10^6 bytes): a shard ends before the image that would take "
                             "it past this (a larger image gets a shard of its own).")
    parser.add_argument("--row_group_size", "--row-group-size", type=int, default=512,
                        help="Images per Parquet row group (the unit a reader reads at once).")
    parser.add_argument("--overwrite", action=ActionYesNo, default=False,
                        help="Write into a non-empty out: replace the shards an earlier recipes pack wrote there "
                             "(nothing else is deleted; a sub-folder or another Parquet file there is an error).")
    return parser


def error(message: str) -> int:
    """One ``recipes pack: error:`` line on stderr; exit code 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    return 2


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 class``, ``3 classes``: the count with thousands separators."""
    return f"{count:,} {word if count == 1 else (many or word + 's')}"


def pack(image_folder: str, out: str, shard_bytes: int, row_group_size: int, overwrite: bool) -> str:
    """Write the shards of ``image_folder`` into ``out``; the summary line. A ``PackError`` for bad input, after
    which ``out`` is as it was (a folder this pack created is removed again)."""
    from recipes.pack.image_source import image_source, read_image_file  # noqa: PLC0415 - after the options parse
    from recipes.pack.out_folder import prepare_out  # noqa: PLC0415
    from recipes.pack.progress import PackProgress, size_text  # noqa: PLC0415
    from recipes.pack.shard_writer import ShardWriter  # noqa: PLC0415

    source = image_source(image_folder)
    for name in source.links_back:
        print(f"{PROG}: {name!r} under {image_folder!r} links back to the image folder: not a class, skipped",
              file=sys.stderr)
    folder, replaced, created = prepare_out(out, source.root, overwrite)
    progress = PackProgress(len(source.images))
    writer = ShardWriter(folder, shard_bytes, row_group_size, on_shard=progress.shard)
    try:
        for image in source.images:
            writer.add(read_image_file(image), image.label, image.path)
            progress.image()
        shards = writer.publish(replaced)
    except BaseException:
        writer.discard()
        if created and not any(folder.iterdir()):
            folder.rmdir()
        raise
    finally:
        progress.close()
    size = sum(path.stat().st_size for path in shards)
    shown = out if out.endswith(("/", "\\")) else out + "/"
    return (f"{PROG}: {plural(len(source.images), 'image')} of {plural(len(source.class_names), 'class', 'classes')} "
            f"in {plural(len(shards), 'shard')} ({size_text(size)}) -> {shown}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``recipes pack``; ``argv`` excludes the word ``pack``. Returns the exit code."""
    from jsonargparse import ArgumentError  # noqa: PLC0415

    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    except ArgumentError as err:  # jsonargparse's lines, as one
        return error(f"{' '.join(line.strip() for line in str(err).splitlines())} ({PROG} --help)")
    if not (args.shard_mb > 0 and math.isfinite(args.shard_mb)):
        return error(f"--shard_mb must be > 0, got {args.shard_mb}")
    if args.row_group_size < 1:
        return error(f"--row_group_size must be >= 1, got {args.row_group_size}")
    try:
        summary = pack(args.image_folder, args.out, max(1, int(args.shard_mb * 1_000_000)), args.row_group_size,
                       args.overwrite)
    except PackError as err:
        return error(str(err))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; out is as it was (no shard written)", file=sys.stderr)
        return 130
    print(summary, flush=True)
    return 0


__all__ = ["build_parser", "main", "pack"]
