"""``recipes pack``: an image folder as Parquet shards of its files' bytes, in the data module's order; shards by
size and row groups; the output written under temporary names; ``--overwrite`` and the one-line bad inputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recipes.cli import main
from recipes.pack.out_folder import SHARD_MARKER
from tests.conftest import REPO, recipes_env
from tests.data_files import make_folder, save


def image_folder(root: Path) -> Path:
    """3 classes x 8 PNGs of 8x8 pixels, a JPEG and a nested folder, and what is skipped (hidden, not images)."""
    make_folder(root, {"cat": 8, "dog": 8, "ant": 8}, size=(8, 8))
    rng = np.random.default_rng(1)
    save(root / "dog" / "photo.JPG", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    save(root / "cat" / "nested" / "deep" / "z.png", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    save(root / "cat" / ".hidden.png", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    save(root / ".ipynb_checkpoints" / "x.png", rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    (root / "ant" / "notes.txt").write_text("not an image")
    return root


#: the rows in the data module's order: classes sorted, paths sorted within a class
EXPECTED = ([("ant", f"ant/{i:02d}.png") for i in range(8)]
            + [("cat", f"cat/{i:02d}.png") for i in range(8)] + [("cat", "cat/nested/deep/z.png")]
            + [("dog", f"dog/{i:02d}.png") for i in range(8)] + [("dog", "dog/photo.JPG")])


def pack(*args: str) -> int:
    """``recipes pack ...`` in this process: its exit code."""
    with pytest.raises(SystemExit) as end:
        main(["pack", *args])
    return end.value.code


def rows(out: Path) -> list[tuple[str, str, bytes]]:
    """(label, path, image bytes) of every row of the shards of ``out``, shard by shard."""
    found = []
    for shard in sorted(out.glob("*.parquet")):
        table = pq.read_table(shard)
        found += zip(table["label"].to_pylist(), table["path"].to_pylist(), table["image"].to_pylist())
    return found


def shard_names(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return image_folder(tmp_path_factory.mktemp("pack") / "images")


def test_pack_writes_each_image_file_as_a_row_in_the_data_modules_order(folder, tmp_path, capsys):
    out = tmp_path / "shards"
    assert pack(str(folder), str(out), "--row_group_size", "5") == 0
    captured = capsys.readouterr()
    size = (out / "part-00000.parquet").stat().st_size
    assert captured.out == f"recipes pack: 26 images of 3 classes in 1 shard ({size / 1000:.0f} kB) -> {out}/\n"
    image_bytes = sum(len(data) for _, _, data in rows(out))
    assert captured.err == f"recipes pack: part-00000.parquet: 26 images ({image_bytes / 1000:.0f} kB)\n"
    assert shard_names(out) == ["part-00000.parquet"]
    assert [(label, path) for label, path, _ in rows(out)] == EXPECTED
    for label, path, data in rows(out):  # the files' bytes as they are, not decoded
        assert data == (folder / path).read_bytes()
    shard = pq.ParquetFile(out / "part-00000.parquet")
    assert shard.schema_arrow.names == ["image", "label", "path"]
    assert pa.types.is_large_binary(shard.schema_arrow.field("image").type)
    assert shard.schema_arrow.field("label").type == pa.string() == shard.schema_arrow.field("path").type
    assert SHARD_MARKER in shard.schema_arrow.metadata
    assert [shard.metadata.row_group(i).num_rows for i in range(shard.num_row_groups)] == [5, 5, 5, 5, 5, 1]


def test_pack_as_a_subprocess_writes_the_same_rows(folder, tmp_path):
    assert pack(str(folder), str(tmp_path / "in_process")) == 0
    done = subprocess.run([sys.executable, "-m", "recipes", "pack", str(folder), str(tmp_path / "child")],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=recipes_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.fullmatch(rf"recipes pack: 26 images of 3 classes in 1 shard \(\d+ kB\) -> {tmp_path}/child/\n",
                        done.stdout)
    assert rows(tmp_path / "child") == rows(tmp_path / "in_process")
    assert [(label, path) for label, path, _ in rows(tmp_path / "child")] == EXPECTED


def test_a_small_shard_mb_cuts_several_shards_of_the_same_rows(folder, tmp_path, capsys):
    assert pack(str(folder), str(tmp_path / "one")) == 0
    limit = 1000  # bytes: 3 or 4 of these small images
    assert pack(str(folder), str(tmp_path / "many"), "--shard-mb", str(limit / 1e6), "--row-group-size", "2") == 0
    names = shard_names(tmp_path / "many")  # no temporary file left
    assert len(names) >= 6 and names == [f"part-{i:05d}.parquet" for i in range(len(names))]
    summary = capsys.readouterr().out.splitlines()[-1]
    assert f"26 images of 3 classes in {len(names)} shards" in summary
    assert rows(tmp_path / "many") == rows(tmp_path / "one")
    sizes = [sum(len(b) for b in pq.read_table(tmp_path / "many" / n)["image"].to_pylist()) for n in names]
    counts = [pq.ParquetFile(tmp_path / "many" / n).metadata.num_rows for n in names]
    assert all(size <= limit for size in sizes) and sum(counts) == 26
    images = [len(r[2]) for r in rows(tmp_path / "many")]
    starts = np.cumsum([0, *counts])
    for i in range(len(names) - 1):  # each shard ends before the image that would take it past the limit
        assert sizes[i] + images[starts[i + 1]] > limit


def test_overwrite_replaces_only_the_shards_pack_wrote(folder, tmp_path, capsys):
    out = tmp_path / "shards"
    assert pack(str(folder), str(out), "--shard_mb", "0.001") == 0
    many = shard_names(out)
    (out / "notes.txt").write_text("mine")
    (out / ".part-00003.parquet.999.partial").write_bytes(b"left by a killed pack")
    capsys.readouterr()
    assert pack(str(folder), str(out)) == 2
    assert capsys.readouterr().err == (f"recipes pack: error: out '{out}' is not empty ({len(many) + 2} entries); "
                                       "--overwrite replaces the shards recipes pack wrote there (and deletes nothing "
                                       "else)\n")
    assert shard_names(out) == sorted([*many, "notes.txt", ".part-00003.parquet.999.partial"])
    assert pack(str(folder), str(out), "--overwrite") == 0
    assert shard_names(out) == ["notes.txt", "part-00000.parquet"]  # the earlier shards and temporary file gone
    assert (out / "notes.txt").read_text() == "mine" and len(rows(out)) == 26

    pq.write_table(pa.table({"x": [1]}), out / "other.parquet")
    capsys.readouterr()
    assert pack(str(folder), str(out), "--overwrite") == 2
    assert capsys.readouterr().err == (f"recipes pack: error: out '{out}' holds other.parquet, a Parquet file recipes "
                                       "pack did not write: it would be read as a shard; move it away or name another "
                                       "out\n")
    (out / "other.parquet").unlink()
    (out / "sub").mkdir()
    assert pack(str(folder), str(out), "--overwrite") == 2
    assert "holds the folder 'sub': ImageFolderDataModule would read out as an image folder" in capsys.readouterr().err


def test_a_corrupt_image_is_named_and_leaves_out_as_it_was(tmp_path, capsys):
    folder = image_folder(tmp_path / "images")
    bad = folder / "dog" / "zz_broken.png"  # the last image: every shard before it was written
    bad.write_bytes(b"this is not an image at all")
    out = tmp_path / "new_out"
    assert pack(str(folder), str(out), "--shard_mb", "0.001") == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (f"recipes pack: error: cannot read image {bad}: UnidentifiedImageError: cannot identify image "
                       f"file '{bad}'")
    assert not out.exists()  # the folder it created is gone again, with the shards written before the bad image

    bad.unlink()
    assert pack(str(folder), str(out)) == 0
    before = {name: (out / name).read_bytes() for name in shard_names(out)}
    bad.write_bytes(b"this is not an image at all")
    assert pack(str(folder), str(out), "--overwrite", "--shard_mb", "0.001") == 2
    assert {name: (out / name).read_bytes() for name in shard_names(out)} == before  # the earlier pack intact


def test_bad_input_is_one_line_and_exit_2(folder, tmp_path, capsys):
    def error(*args: str) -> str:
        capsys.readouterr()
        assert pack(*args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("recipes pack: error: ")
        return err.removeprefix("recipes pack: error: ").rstrip("\n")

    missing = tmp_path / "no_such_folder"
    assert error(str(missing), str(tmp_path / "out")) == f"the image folder '{missing}' does not exist"
    (tmp_path / "a_file.png").write_bytes(b"x")
    assert error(str(tmp_path / "a_file.png"), str(tmp_path / "out")) == (
        f"'{tmp_path / 'a_file.png'}' is not a folder (expected an image folder: <folder>/<class name>/*.png|*.jpg|"
        "*.jpeg)")
    (tmp_path / "flat").mkdir()
    save(tmp_path / "flat" / "loose.png", np.zeros((4, 4, 3), dtype=np.uint8))
    assert error(str(tmp_path / "flat"), str(tmp_path / "out")) == (
        f"no class folders under '{tmp_path / 'flat'}'; expected one sub-folder of images per class "
        "(root/<class name>/*.png|*.jpg|*.jpeg)")
    assert error(str(folder), str(tmp_path / "a_file.png")) == (
        f"out '{tmp_path / 'a_file.png'}' is a file; name a new or empty folder for the shards")
    assert error(str(folder), str(folder / "shards")) == (
        f"out '{folder / 'shards'}' is inside the image folder (the shards would be read as a class folder); name a "
        "folder outside it")
    assert error(str(folder), str(tmp_path / "out"), "--shard_mb", "0") == "--shard_mb must be > 0, got 0.0"
    assert error(str(folder), str(tmp_path / "out"), "--row_group_size", "0") == "--row_group_size must be >= 1, got 0"
    assert error(str(folder)).startswith("the following arguments are required: out")
    assert not (tmp_path / "out").exists() and not (folder / "shards").exists()


def test_help_explains_the_output_and_imports_no_lightning():
    code = ("import sys\nfrom recipes.cli import main\ntry:\n    main(['pack', '--help'])\nexcept SystemExit as end:\n"
            "    print('RESULT', end.code, 'lightning' in sys.modules, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=recipes_env())
    assert done.stdout.splitlines()[-1] == "RESULT 0 False False", done.stdout + done.stderr[-2000:]
    text = " ".join(done.stdout.split())
    for says in ("part-00000.parquet", "image (binary: the file's bytes as they are, not decoded)",
                 "label (string: its class folder's name)", "--shard_mb", "--row_group_size", "--overwrite",
                 "(type: float, default: 256.0)", "(type: int, default: 512)"):
        assert says in text, says
    listed = subprocess.run([sys.executable, "-m", "recipes", "--help"], capture_output=True, text=True, timeout=300,
                            cwd=REPO, env=recipes_env()).stdout
    assert "  pack       an image folder as Parquet shards: recipes pack <image folder> <out>" in listed
