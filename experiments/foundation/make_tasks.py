"""The two Fashion-MNIST tasks of the LoRA recipe (docs/foundation.md), as `data.dataset: files` .npz files:

    python experiments/foundation/make_tasks.py [--from DIR] [--out DIR]

reads the four IDX files of real Fashion-MNIST (by default from the Debian package `dataset-fashion-mnist`,
/usr/share/datasets/fashion-mnist; `--from` another folder holding them) and writes, in `--out`
(default data/foundation):

    fmnist_0to4.npz   the training and test images of classes 0-4 (T-shirt, trouser, pullover, dress, coat),
                      labels 0-4
    fmnist_5to9.npz   those of classes 5-9 (sandal, shirt, sneaker, bag, ankle boot), labelled 0-4 (class c
                      as c - 5)

Both tasks have five classes, so a model pretrained on the first has the five outputs the second needs, each
now meaning another class it has never seen: a label shift. Images stay uint8 (distfl scales them by 1/255
as it does Fashion-MNIST's).
"""
from __future__ import annotations

import argparse
import gzip
import os

import numpy as np

DEBIAN_FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
TASKS = {"fmnist_0to4": range(0, 5), "fmnist_5to9": range(5, 10)}


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzipped) as a numpy array: images N x 28 x 28 or labels N, uint8."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", default=DEBIAN_FMNIST_DIR, help="folder of the four IDX files")
    parser.add_argument("--out", default="data/foundation", help="folder to write the two .npz files in")
    args = parser.parse_args()
    split = {}
    for name, prefix in (("train", "train"), ("test", "t10k")):
        paths = [os.path.join(args.source, f"{prefix}-{kind}-idx{n}-ubyte.gz") for kind, n in (("images", 3), ("labels", 1))]
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            raise SystemExit(f"make_tasks.py: {missing[0]} not found; install the Debian package "
                             f"dataset-fashion-mnist or give --from the folder of the four IDX files")
        split[name] = (read_idx(paths[0]), read_idx(paths[1]))
    os.makedirs(args.out, exist_ok=True)
    for task, classes in TASKS.items():
        arrays = {}
        for name, (images, labels) in split.items():
            keep = np.isin(labels, list(classes))
            arrays[f"x_{name}"] = images[keep][:, None]  # N x 1 x 28 x 28
            arrays[f"y_{name}"] = labels[keep].astype(np.int64) - classes.start
        path = os.path.join(args.out, f"{task}.npz")
        np.savez(path, **arrays)
        print(f"wrote {path}: {len(arrays['y_train'])} training and {len(arrays['y_test'])} test images of "
              f"classes {classes.start}-{classes.stop - 1} (labels 0-4)")


if __name__ == "__main__":
    main()
