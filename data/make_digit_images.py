"""Writes scikit-learn's bundled handwritten digits as a folder of PNG images, one sub-folder per class (no download):

    python data/make_digit_images.py                 # data/digit_images/<0..9>/<index>.png, 64 x 64 RGB
    python data/make_digit_images.py --size 224 --out my_digits

The 1,797 8x8 grey images (values 0-16) are scaled to 0-255, upscaled with Pillow's bilinear filter and saved as RGB
PNG files named by their index in ``load_digits()``, so the folder is the same on every machine. It is the image
folder of ``configs/image_finetune_hf.yaml`` and the shape of any folder of your own (``root/<class name>/*.png``).
Existing files are left alone: the script writes only the images that are missing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent


def write_digit_images(out: Path, size: int = 64, digits: tuple[int, ...] = tuple(range(10))) -> int:
    """Write the digits ``digits`` under ``out/<digit>/<index>.png`` at ``size`` x ``size``; returns the count."""
    data = load_digits()
    written = 0
    for index, (image, label) in enumerate(zip(data.images, data.target)):
        if int(label) not in digits:
            continue
        path = out / str(int(label)) / f"{index:04d}.png"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(np.round(image * (255.0 / 16.0)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").resize((size, size), Image.Resampling.BILINEAR).convert("RGB").save(path)
        written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "digit_images", help="folder to write into")
    parser.add_argument("--size", type=int, default=64, help="side of the square images in pixels")
    args = parser.parse_args()
    count = write_digit_images(args.out, args.size)
    print(f"wrote {count} images under {args.out}")


if __name__ == "__main__":
    main()
