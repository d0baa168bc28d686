"""TensorFlow Federated's HDF5 client data (also what FedJAX and FedML read): one file per split, a group
`examples` holding one group per client id, and in it one dataset per feature, the client's samples
along the first axis (TFF's `tff.simulation.datasets.FilePerUserClientData`/`HDF5ClientData` layout).

data.path is the folder with the downloaded pair of files; the federation is named by their prefix:

- `fed_emnist_train.h5` / `fed_emnist_test.h5` (and `fed_emnist_digitsonly_*`): `pixels` float32
  N x 28 x 28 in [0, 1], `label` int; 62 classes (10 for digitsonly). The same writers in both files: each
  writer's test file entry is its own test split.
- `fed_cifar100_train.h5` / `fed_cifar100_test.h5` (the Pachinko split of Reddi et al.): `image` uint8
  N x 32 x 32 x 3 (scaled by 1/255, channels first here), `label` int (the 100 fine classes; the file's
  `coarse_label` is not used). The test clients are others than the training clients: they form the
  test split only.

The clients are the training file's client ids in sorted order (h5py lists a group's members sorted).
TFF's text federations, `shakespeare_*.h5` and `stackoverflow_*.h5`, are next-token tasks: data/tff_text.py.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from distfl.data.natural import Federated, concatenate
from distfl.errors import DataError

# prefix -> (input feature, classes, train-and-test clients are the same people)
FEDERATIONS = {
    "fed_emnist": ("pixels", 62, True),
    "fed_emnist_digitsonly": ("pixels", 10, True),
    "fed_cifar100": ("image", 100, False),
}
TEXT = ("stackoverflow", "shakespeare")


def find_federation(folder: str) -> str:
    if not os.path.isdir(folder):
        raise DataError(f"data.path {folder} is not a folder; give the folder holding TFF's PREFIX_train.h5 and "
                        f"PREFIX_test.h5 ({', '.join(tuple(FEDERATIONS) + TEXT)})")
    names = set(os.listdir(folder))
    for prefix in sorted(FEDERATIONS, key=len, reverse=True):
        if f"{prefix}_train.h5" in names and f"{prefix}_test.h5" in names:
            return prefix
    for prefix in TEXT:
        if f"{prefix}_train.h5" in names and f"{prefix}_test.h5" in names:
            return prefix
    raise DataError(f"data.path {folder} holds no pair PREFIX_train.h5, PREFIX_test.h5 for PREFIX in "
                    f"{', '.join(tuple(FEDERATIONS) + TEXT)} (TFF's downloads; docs/datasets.md)")


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def client_groups(path: str, features: tuple[str, ...]):
    """(client id, its h5py group) of every client of a TFF file, in sorted order; DataError (one line)
    for a file that is not HDF5, has no group `examples`, or a client without one of `features`."""
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"data.path: cannot read {path} as HDF5 ({exc})") from None
    with handle:
        # HDF5's metadata cache grows to 32 MiB by default, and the process by some 5 KB for every client
        # opened (214 MiB over 40,000 StackOverflow users, measured): a 4 MiB cache keeps reading a file of
        # any number of clients in bounded memory, no slower.
        cache = handle.id.get_mdc_config()
        cache.set_initial_size, cache.initial_size, cache.min_size, cache.max_size = True, 1 << 20, 1 << 20, 4 << 20
        handle.id.set_mdc_config(cache)
        if "examples" not in handle or not isinstance(handle["examples"], h5py.Group):
            raise DataError(f"data.path: {path} has no group 'examples' (TFF's files hold examples/<client id>/<feature>)")
        for client in handle["examples"]:  # h5py lists the members sorted by name
            group = handle["examples"][client]
            missing = [k for k in features if k not in group]
            if missing:
                raise DataError(f"data.path: {path}: client {client!r} lacks {', '.join(missing)} (has "
                                f"{', '.join(group)})")
            yield str(client), group


def _read(path: str, feature: str, classes: int) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    ids, xs, ys = [], [], []
    for client, group in client_groups(path, (feature, "label")):
        x, y = group[feature][()], group["label"][()]
        if x.ndim < 3 or len(x) != len(y) or y.ndim != 1:
            raise DataError(f"data.path: {path}: client {client!r} has {feature} of shape {x.shape} and label of "
                            f"shape {y.shape}; they must pair one to one (N x ... and N)")
        if not np.issubdtype(y.dtype, np.integer) or (len(y) and (y.min() < 0 or y.max() >= classes)):
            raise DataError(f"data.path: {path}: client {client!r} has labels of {y.dtype} outside 0..{classes - 1}")
        if feature == "image":
            if x.dtype != np.uint8 or x.shape[1:] != (32, 32, 3):
                raise DataError(f"data.path: {path}: client {client!r} has image {x.dtype} {x.shape[1:]}; "
                                "fed_cifar100 stores uint8 32 x 32 x 3")
            x = x.transpose(0, 3, 1, 2).astype(np.float32) / 255.0
        else:
            if not np.issubdtype(x.dtype, np.floating) or x.shape[1:] != (28, 28):
                raise DataError(f"data.path: {path}: client {client!r} has pixels {x.dtype} {x.shape[1:]}; "
                                "fed_emnist stores float 28 x 28")
            x = x[:, None].astype(np.float32)
        ids.append(str(client))
        xs.append(x)
        ys.append(y.astype(np.int64))
    if not ids:
        raise DataError(f"data.path: {path}: 'examples' holds no client")
    return ids, xs, ys


def split_paths(folder: str, prefix: str) -> tuple[str, str]:
    return os.path.join(folder, f"{prefix}_train.h5"), os.path.join(folder, f"{prefix}_test.h5")


def load_tff(folder: str) -> Federated:
    """TFF's image federations (data/tff_text.py `load_tff_folder` reads the text ones too)."""
    prefix = find_federation(folder)
    if prefix in TEXT:
        raise DataError(f"data.path {folder}: {prefix} is a text federation, read by data/tff_text.py")
    train_path, test_path = split_paths(folder, prefix)
    feature, classes, same_people = FEDERATIONS[prefix]
    ids, train_xs, train_ys = _read(train_path, feature, classes)
    test_ids, test_xs, test_ys = _read(test_path, feature, classes)
    sources = {f"data.path {os.path.basename(p)}": (p, file_sha256(p)) for p in (train_path, test_path)}
    return assemble(train_path, (ids, train_xs, train_ys), (test_ids, test_xs, test_ys), same_people, classes,
                    prefix, sources)


def assemble(train_path: str, train, test, same_people: bool, classes: int, name: str, sources: dict,
             tokens=None) -> Federated:
    """The Federated of per-client (ids, xs, ys) of TFF's train and test files: the training file's clients,
    and with `same_people` each one's own test samples (test-only ids after them, in no client's split)."""
    (ids, train_xs, train_ys), (test_ids, test_xs, test_ys) = train, test
    empty = [c for c, y in zip(ids, train_ys) if len(y) == 0]
    if empty:
        raise DataError(f"data.path: {train_path}: client {empty[0]!r} has no training sample")
    if same_people:  # each client's own test samples first, in client order; test-only ids after them
        own = dict(zip(test_ids, zip(test_xs, test_ys)))
        blank = (np.zeros((0,) + train_xs[0].shape[1:], train_xs[0].dtype), np.zeros((0,) + train_ys[0].shape[1:], np.int64))
        known = set(ids)
        ordered = [own.get(c, blank) for c in ids] + [own[c] for c in test_ids if c not in known]
        test_xs, test_ys = [x for x, _ in ordered], [y for _, y in ordered]
        mine = len(ids)
    else:
        mine = 0
    x_dtype = np.int64 if tokens is not None else np.float32
    train_x, train_y, train_offsets = concatenate(train_xs, train_ys, x_dtype)
    test_x, test_y, test_offsets = concatenate(test_xs, test_ys, x_dtype)
    test_offsets = test_offsets[:mine + 1] if mine else np.zeros(len(ids) + 1, dtype=np.int64)
    return Federated(train_x, train_y, train_offsets, test_x, test_y, test_offsets, classes, name,
                     client_ids=ids, sources=sources, tokens=tokens)
