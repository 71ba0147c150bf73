"""Issue 28, parts 8 and 9: every bad file or setting is one clear line naming the file, the setting or the
condition, and what to do (image folders that link back into themselves, booleans in numeric columns, files that are
not UTF-8, very long fields, symbolic link loops, accumulate_grad_batches 0, a learning rate of nan, a truncated
checkpoint, a full disk while a checkpoint is written)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from datamodules.image_files import find_images, find_images_to_predict


def make_images(folder: Path, count: int) -> list[Path]:
    """``count`` tiny PNGs in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"{i:02d}.png"
        Image.fromarray(np.full((4, 4, 3), i * 10, dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def test_a_folder_linking_back_into_itself_gives_each_image_once(tmp_path):
    folder = tmp_path / "new"
    make_images(folder, 3)
    make_images(folder / "sub", 2)
    os.symlink(folder, folder / "sub" / "up")  # a directory link back to the folder (followed 40 deep, it was)
    found = find_images(folder)
    assert len(found) == 5 and len(set(map(os.path.realpath, found))) == 5
    assert find_images_to_predict(str(folder)) == found


def test_a_linked_folder_elsewhere_is_still_followed(tmp_path):
    make_images(tmp_path / "store", 2)
    make_images(tmp_path / "root" / "cat", 1)
    os.symlink(tmp_path / "store", tmp_path / "root" / "cat" / "more")
    assert [Path(p).name for p in find_images(tmp_path / "root" / "cat")] == ["00.png", "00.png", "01.png"]


def test_a_training_class_folder_linking_to_itself_is_read_once(tmp_path):
    from datamodules.image_folder import ImageFolderDataModule

    for name in ("a", "b"):
        make_images(tmp_path / name, 4)
        os.symlink(tmp_path / name, tmp_path / name / "loop")
    data = ImageFolderDataModule(str(tmp_path), image_size=4, batch_size=2, val_fraction=0.25, test_fraction=0.0)
    data.setup("fit")
    assert len(data.sample_paths) == 8 and len(set(map(os.path.realpath, data.sample_paths))) == 8


@pytest.mark.parametrize("kind", ["image", "table", "text"])
def test_a_symlink_loop_as_predict_path_is_one_line(tmp_path, kind):
    loop = tmp_path / ("loop" if kind == "image" else "loop.csv")
    os.symlink(loop, loop)
    if kind == "image":
        with pytest.raises(FileNotFoundError) as err:
            find_images_to_predict(str(loop))
    elif kind == "table":
        from datamodules.table_files import read_table

        with pytest.raises(FileNotFoundError) as err:
            read_table(loop)
    else:
        from datamodules.text_files import read_text_label_file

        with pytest.raises(FileNotFoundError) as err:
            read_text_label_file(loop, "text", None)
    message = str(err.value)
    assert "symbolic link that leads back to itself" in message and str(loop) in message
    assert "\n" not in message and not isinstance(err.value.__context__, RuntimeError)  # no second traceback


def test_a_latin1_byte_in_a_table_names_the_file_line_and_byte(tmp_path):
    from datamodules.table_files import read_table

    table = tmp_path / "new.csv"
    table.write_bytes(b"x,city\n1,Paris\n2,Orl\xe9ans\n" + b"3,Lyon\n" * 5000)
    with pytest.raises(ValueError) as err:
        read_table(table)
    message = str(err.value)
    assert f"{str(table)!r} is not UTF-8 text: line 3, byte 20 is 0xe9" in message
    assert "save the file as UTF-8" in message and "\n" not in message


def test_a_latin1_byte_deep_in_a_text_file_names_its_line(tmp_path):
    from datamodules.text_files import read_text_label_file

    texts = tmp_path / "new.csv"
    body = b"text,label\n" + b"fine words,a\n" * 20000 + b"caf\xe9,b\n"
    texts.write_bytes(body)
    with pytest.raises(ValueError) as err:
        read_text_label_file(texts, "text", "label")
    offset = body.index(b"\xe9")
    assert f"is not UTF-8 text: line 20002, byte {offset} is 0xe9" in str(err.value)


def test_a_table_with_huge_fields_is_read_or_named(tmp_path):
    from datamodules.table_files import read_table

    table = tmp_path / "wide.csv"
    table.write_text("x,note\n1," + "a" * 300_000 + "\n2,b\n")
    assert read_table(table)["note"].str.len().tolist() == [300_000, 1]
    one_line = tmp_path / "one_line.csv"
    one_line.write_text("a" * 2_000_000)  # a single 2 MB line: a header and no rows
    with pytest.raises(ValueError, match=r"one_line.csv' has no data rows"):
        read_table(one_line)


@pytest.mark.parametrize("size", [200_000, 10_000_000])
def test_a_long_text_is_read_and_cut_to_max_length(tmp_path, size):
    from datamodules.text_files import read_text_label_file
    from datamodules import TextClassificationDataModule

    texts = tmp_path / "long.csv"
    rows = [f"word{i % 7} other{i % 3},{'ab'[i % 2]}" for i in range(40)]
    texts.write_text("text,label\n" + f"{'long ' * (size // 5)},a\n" + "\n".join(rows) + "\n")
    read, labels, lines = read_text_label_file(texts, "text", "label")
    assert len(read[0]) == size and labels[:2] == ["a", "a"] and lines[:2] == [2, 3]
    data = TextClassificationDataModule(str(texts), max_length=16, batch_size=4, val_fraction=0.25)
    data.setup("fit")
    lengths = [len(sample["input_ids"]) for name in ("train", "val") for sample in data.split(name)]
    assert len(lengths) == 41 and max(lengths) == 16  # the long text, cut to max_length


def test_true_false_in_a_numeric_column_of_a_predict_file_names_file_column_and_row(tmp_path):
    from datamodules import TabularDataModule

    train = tmp_path / "train.csv"
    train.write_text("x,y,label\n" + "".join(f"{i % 5},{i % 3},{'ab'[i % 2]}\n" for i in range(40)))
    data = TabularDataModule(str(train), target="label", batch_size=8)
    data.setup("fit")
    assert data.numeric_columns == ["x", "y"]
    new = tmp_path / "new.csv"
    new.write_text("x,y\n1,2\n3,true\n")  # a mixed column: text
    with pytest.raises(ValueError, match=r"column 'y' of '.*new.csv' is treated as numeric but has the non-numeric "
                       r"value 'true' at row 1"):
        data.frame_data(__import__("pandas").read_csv(new), repr(str(new)))
    new.write_text("x,y\n1,true\n3,false\n")  # pandas reads a column of only true/false as booleans
    data.predict_path = str(new)
    with pytest.raises(ValueError) as err:
        data.new_data()
    assert (f"column 'y' of {str(new)!r} is numeric but has the boolean True at row 0 (2 such row(s)); write "
            "numbers there (1/0)") in str(err.value)


def test_true_false_in_a_train_file_is_categorical_or_an_error_when_declared_numeric(tmp_path):
    from datamodules import TabularDataModule

    train = tmp_path / "train.csv"
    train.write_text("x,flag,label\n" + "".join(f"{i % 5},{'true' if i % 3 else 'false'},{'ab'[i % 2]}\n"
                                                for i in range(40)))
    data = TabularDataModule(str(train), target="label", batch_size=8)
    data.setup("fit")
    assert data.numeric_columns == ["x"] and data.vocabularies == {"flag": ["False", "True"]}
    declared = TabularDataModule(str(train), target="label", batch_size=8, categorical=[])
    with pytest.raises(ValueError, match=r"column 'flag' of '.*train.csv' is numeric but has the boolean False at "
                       r"row 0 \(40 such row\(s\)\)"):
        declared.setup("fit")


@pytest.mark.parametrize("size", [100, 5_000, 50_000, "half", "all but 10"])
def test_a_cut_checkpoint_is_truncated_or_corrupt_whatever_its_size(tmp_path, size):
    import torch

    from recipes.checkpoints.files import CheckpointError, load_checkpoint_weights_only

    full = tmp_path / "full.ckpt"
    torch.save({"state_dict": {"w": torch.randn(200, 200)}, "epoch": 3}, full)
    data = full.read_bytes()
    keep = {"half": len(data) // 2, "all but 10": len(data) - 10}.get(size, size)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[:keep])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint_weights_only(cut)
    assert f"--ckpt_path {cut}: the file is truncated or corrupt ({keep:,} bytes;" in str(err.value)
    assert str(err.value).endswith("copy it again, or use an earlier checkpoint")


def test_a_zip_that_is_no_torch_file_is_not_called_truncated(tmp_path):
    import zipfile

    from recipes.checkpoints.files import CheckpointError, load_checkpoint_weights_only

    other = tmp_path / "other.ckpt"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("readme.txt", "hello " * 100)
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint file"):
        load_checkpoint_weights_only(other)


def fail_on_files(real_save, error: BaseException):
    """``torch.save`` that writes half the checkpoint to a real file and raises ``error`` (a full disk), and saves
    normally to anything else (the size count)."""

    def save(obj, f, *args, **kwargs):
        import io

        try:
            f.fileno()
        except (AttributeError, io.UnsupportedOperation):
            return real_save(obj, f, *args, **kwargs)

        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise error

    return save


@pytest.mark.parametrize(
    "error",
    [OSError(28, "No space left on device"),
     RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4096 vs 3987")],
    ids=["ENOSPC", "torch_unexpected_pos"],
)
def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_keeps_the_previous(tmp_path, monkeypatch, error):
    import shutil

    import torch

    from recipes.checkpoints.atomic_io import AtomicCheckpointIO, CheckpointDiskFull

    target = tmp_path / "run" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(10)}, "global_step": 1}, target)
    before = target.read_bytes()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(torch, "save", fail_on_files(torch.save, error))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=123_456))
    with pytest.raises(CheckpointDiskFull) as err:
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(100_000)}, "global_step": 2}, target)
    message = str(err.value)
    needs = re.search(r"the checkpoint needs ([\d,]+) bytes", message)[1]
    needed = len(before) - 10 * 4 + 100_000 * 4  # the same checkpoint with 100,000 floats instead of 10
    assert abs(int(needs.replace(",", "")) - needed) < 1024
    assert message == (f"the disk is full at {target.parent} (No space left on device) while writing last.ckpt "
                       f"(123,456 bytes free; the checkpoint needs {needs} bytes): free some space there or point "
                       "--checkpoints_dir at a disk with room, then resume with --ckpt_path last; the previous "
                       "last.ckpt is kept intact")
    assert "\n" not in message and target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]


def test_a_torch_write_error_with_room_on_the_disk_is_not_called_disk_full(tmp_path, monkeypatch):
    import torch

    from recipes.checkpoints.atomic_io import AtomicCheckpointIO, CheckpointDiskFull

    target = tmp_path / "last.ckpt"
    monkeypatch.setattr(torch, "save", fail_on_files(torch.save, RuntimeError("unexpected pos 10 vs 5")))
    with pytest.raises(RuntimeError, match="unexpected pos") as err:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(10)}, target)
    assert not isinstance(err.value, CheckpointDiskFull) and not target.exists()


def test_a_single_40_mb_line_is_a_short_message(tmp_path):
    from datamodules.table_files import read_table
    from datamodules.text_files import read_text_label_file

    big = tmp_path / "big.csv"
    big.write_text("x" * 40_000_000)  # one line, no newline: a header of one 40 MB field, no rows
    with pytest.raises(ValueError) as table_err:
        read_table(big)
    with pytest.raises(ValueError) as text_err:
        read_text_label_file(big, "text", None)
    assert "has no data rows (columns: ['" + "x" * 60 + "... (40,000,000 characters)'])" in str(table_err.value)
    assert "the header has no field 'text'; its fields are ['" + "x" * 60 + "... (40,000,000 characters)']" in str(
        text_err.value
    )
    assert len(str(table_err.value)) < 300 and len(str(text_err.value)) < 300
