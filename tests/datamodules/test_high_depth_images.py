"""16-bit images are scaled, not clipped (issue 16, item 7): Pillow's convert("L") turns every 16-bit value above
255 into 255, so a 16-bit PNG became an all-white image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.image_files import read_image


@pytest.mark.parametrize("channels", [1, 3])
def test_a_16_bit_png_reads_as_its_8_bit_version(tmp_path, channels):
    rng = np.random.default_rng(0)
    eight = rng.integers(0, 256, size=(12, 10), dtype=np.uint8)
    Image.fromarray(eight, mode="L").save(tmp_path / "eight.png")
    Image.fromarray(eight.astype(np.uint16) * 257).save(tmp_path / "sixteen.png")  # the same picture, 16 bits
    assert Image.open(tmp_path / "sixteen.png").mode.startswith("I")
    a = read_image(str(tmp_path / "eight.png"), (12, 10), channels)
    b = read_image(str(tmp_path / "sixteen.png"), (12, 10), channels)
    assert torch.equal(a, b)  # it was all 255 (white) before
    assert abs(b.float().mean().item() - float(eight.mean())) < 1.0


def test_16_bit_values_between_8_bit_levels_round_to_the_nearest(tmp_path):
    values = np.array([[0, 128, 256, 1000, 30000, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "levels.png")
    read = read_image(str(tmp_path / "levels.png"), (1, 6), 1)
    assert read.flatten().tolist() == [0, 0, 1, 4, 117, 255]  # round(v / 257)
    assert (read.float() - torch.tensor(values.astype(np.float64) / 257.0).flatten()).abs().max() <= 0.5
