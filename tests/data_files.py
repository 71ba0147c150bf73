"""Small data files the tests write: images and image folders, keyword reviews as CSV or JSON lines, mixed-type tables
(shared by tests/datamodules, tests/predict and tests/checkpoints)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

FILLER = "the a of film plot actor scene story music ending one two red blue long short time day night light".split()
KEYWORDS = {"pos": ["excellent", "wonderful", "brilliant"], "neg": ["terrible", "boring", "awful"]}


def save(path: Path, array: np.ndarray, mode: str | None = None) -> Path:
    """Write ``array`` (H, W) or (H, W, C) uint8 as an image; the format follows the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array)
    if mode is not None:
        image = image.convert(mode)
    image.save(path, format="JPEG" if path.suffix.lower() in (".jpg", ".jpeg") else "PNG")
    return path


def make_folder(root: Path, counts: dict[str, int], size: tuple[int, int] = (8, 8), seed: int = 0) -> Path:
    """``counts[name]`` random RGB PNGs of ``size`` (height, width) in ``root/<name>/NN.png``."""
    rng = np.random.default_rng(seed)
    for name, n in counts.items():
        for i in range(n):
            save(root / name / f"{i:02d}.png", rng.integers(0, 256, (*size, 3), dtype=np.uint8))
    return root


def keyword_rows(n: int, seed: int = 0, min_words: int = 3, max_words: int = 30) -> list[tuple[str, str]]:
    """``n`` (text, label) rows, half "pos" and half "neg"; the label is decided by one keyword in the text."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 == 0 else "neg"
        words = [rng.choice(FILLER) for _ in range(rng.randint(min_words, max_words) - 1)]
        words.insert(rng.randint(0, len(words)), rng.choice(KEYWORDS[label]))
        rows.append((" ".join(words), label))
    return rows


def write_csv(path: Path, rows, fields=("text", "label")) -> Path:
    """``rows`` under a header of ``fields`` as CSV."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows, fields=("text", "label")) -> Path:
    """``rows`` as JSON lines with the keys ``fields``."""
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(dict(zip(fields, row))) + "\n")
    return path


def make_frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    """A string label, a string categorical column, two float columns and an int column."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "x1": rng.normal(size=n),
            "color": rng.choice(["red", "green", "blue"], size=n),
            "x2": rng.normal(10.0, 3.0, size=n),
            "size": rng.integers(1, 4, size=n),
            "label": rng.choice(["zebra", "ant", "mouse"], size=n),
        }
    )


def write(frame: pd.DataFrame, path: Path) -> Path:
    """``frame`` as CSV (a ``.csv`` suffix) or Parquet."""
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    return path
