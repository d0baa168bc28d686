"""LEAF's federated datasets (Caldas et al. 2018, "LEAF: A Benchmark for Federated Settings";
github.com/TalwalkarLab/leaf), read from the JSON files its preprocessing writes.

Each file is one JSON object: `users` (the user ids), `num_samples` (one count per user), `user_data`
(user id -> {"x": [...], "y": [...]}) and, for some datasets, `hierarchies` (one group per user).
data.path is a LEAF dataset's `data/` folder (or any folder laid out like it):

- with `train/` and `test/` (what LEAF's preprocess.sh writes with `-t sample` or `-t user`): the clients
  are the training files' users, in file-name order, then each file's `users` order; each client's own
  test samples are its entry in the test files (a user-wise split gives none: its test users only make
  up the test split);
- with only `all_data/`: split here as LEAF's data/utils/split_data.py splits it, 90% to training, with
  `random.Random(data seed)` as its rng and the files in name order (split_data.py takes os.listdir's):
  data.leaf_split=sample (--by_sample: each user with at least 2 samples keeps rng.sample of
  max(1, int(0.9 n)) of them, 1 of 2, for training; users with fewer are dropped) or user (--by_user:
  rng.sample of int(0.9 U) of the U users train, the others are the test split).

What the samples are is read from them: 784 numbers a sample -> FEMNIST's 28 x 28 grey image (1 x 28 x 28
float32, as LEAF stores it: 1 is white), 62 classes; other numbers -> a vector (1 x 1 x D), classes 0..max(y);
a string -> Shakespeare: a character sequence mapped by LEAF's 80-character vocabulary (ALL_LETTERS of
models/utils/language_utils.py, `ALL_LETTERS.find(c)`) to int64 indices, the label the index of the next
character (y), 80 classes; a tweet record -> Sent140 (LEAF's 25 word ids from data.embeddings, 2
classes); chunks of tokens -> Reddit (next-token chunks, ids from data.vocabulary). Both: data/leaf_text.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import random

import numpy as np

from distfl.data import leaf_text
from distfl.data.natural import Federated, concatenate
from distfl.errors import DataError
from distfl.plain_pickle import brief

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
FEMNIST_CLASSES = 62
FEMNIST_PIXELS = 28 * 28
TRAIN_FRACTION = 0.9  # split_data.py's --frac default
SPLITS = ("sample", "user")
FLOAT32_MAX = float(np.finfo(np.float32).max)
MAX_LABEL = 2**31 - 1  # class numbers beyond it would be an output layer of billions of units


def _json_files(folder: str) -> list[str]:
    names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    if not names:
        raise DataError(f"data.path: {folder} holds no .json file (LEAF writes its users into .json files there)")
    return [os.path.join(folder, n) for n in names]


def read_leaf_file(path: str, digest) -> dict:
    """One LEAF JSON file, checked: users (distinct ids), num_samples and user_data agree, every x pairs
    with a y. DataError naming the file (and the user) otherwise."""
    with open(path, "rb") as f:
        raw = f.read()
    digest.update(os.path.basename(path).encode() + b"\0" + hashlib.sha256(raw).hexdigest().encode())
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise DataError(f"data.path: {path} is not JSON ({exc}); LEAF's files are JSON objects") from None
    except RecursionError:
        raise DataError(f"data.path: {path} nests its values thousands of levels deep; LEAF's files nest a "
                        "few") from None
    missing = [k for k in ("users", "num_samples", "user_data") if not isinstance(data, dict) or k not in data]
    if missing:
        raise DataError(f"data.path: {path} lacks {', '.join(missing)}; a LEAF file holds users, num_samples and "
                        "user_data (and optionally hierarchies)")
    users, counts, user_data = data["users"], data["num_samples"], data["user_data"]
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        bad = next((u for u in users if not isinstance(u, str)), None) if isinstance(users, list) else users
        raise DataError(f"data.path: {path}: users must be a list of user ids (strings, the keys of user_data), "
                        f"got {brief(bad)}")
    if not isinstance(counts, list) or not all(type(c) is int and c >= 0 for c in counts):
        raise DataError(f"data.path: {path}: num_samples must be a list of sample counts (integers >= 0), got "
                        f"{brief(counts)}")
    if not isinstance(user_data, dict):
        raise DataError(f"data.path: {path}: user_data must map each user id to its {{x, y}}, got "
                        f"{type(user_data).__name__} {brief(user_data)}")
    if len(users) != len(counts):
        raise DataError(f"data.path: {path} lists {len(users)} users but {len(counts)} num_samples")
    listed = set()
    for user, count in zip(users, counts):
        if user in listed:
            raise DataError(f"data.path: {path} lists user {brief(user)} twice in users; each LEAF user is one "
                            "client, listed once")
        listed.add(user)
        entry = user_data.get(user)
        if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
            raise DataError(f"data.path: {path}: user_data has no {{x, y}} for user {brief(user)}")
        if not isinstance(entry["x"], list) or not isinstance(entry["y"], list):
            raise DataError(f"data.path: {path}: user {brief(user)}: x and y must be lists of samples, got "
                            f"{type(entry['x']).__name__} and {type(entry['y']).__name__}")
        if leaf_text.is_reddit(entry) and len(entry["x"]) != len(entry["y"]):
            # preprocess.py keeps the user's whole comment count in every split: only x and y must agree
            raise DataError(f"data.path: {path}: user {brief(user)} has {len(entry['x'])} x and {len(entry['y'])} y; "
                            "each Reddit comment's chunks (x) need their targets (y)")
        if not len(entry["x"]) == len(entry["y"]) == count and not leaf_text.is_reddit(entry):
            raise DataError(f"data.path: {path}: user {brief(user)} has {len(entry['x'])} x and {len(entry['y'])} y "
                            f"but num_samples says {count}; x, y and num_samples must agree")
    return data


def _read_folder(folder: str, digest, file_of: dict) -> list[tuple[str, dict]]:
    """[(user, {x, y})] of every file in `folder`, in file-name order, then each file's users order; each
    user's file into `file_of`."""
    out = []
    for path in _json_files(folder):
        data = read_leaf_file(path, digest)
        for user in data["users"]:
            if user in file_of:
                raise DataError(f"data.path: user {brief(user)} is listed in both {file_of[user]} and {path}; each "
                                "LEAF user is one client, in one file of a folder")
            file_of[user] = path
        out += [(u, data["user_data"][u]) for u in data["users"]]
    return out


def split_by_sample(users: list[tuple[str, dict]], rng: random.Random):
    """split_data.py --by_sample, user by user (its files in order): (train, test) lists of (user, {x, y})."""
    train, test = [], []
    for user, entry in users:
        n = len(entry["y"])
        if n < 2:
            continue
        n_train = 1 if n == 2 else max(1, int(TRAIN_FRACTION * n))
        chosen = set(rng.sample(range(n), n_train))
        keep = [j in chosen for j in range(n)]
        train.append((user, {k: [v for v, t in zip(entry[k], keep) if t] for k in ("x", "y")}))
        test.append((user, {k: [v for v, t in zip(entry[k], keep) if not t] for k in ("x", "y")}))
    return train, test


def split_by_user(users: list[tuple[str, dict]], rng: random.Random):
    """split_data.py --by_user: a sample of int(0.9 U) users train (in their order), the rest test."""
    chosen = set(rng.sample(range(len(users)), int(TRAIN_FRACTION * len(users))))
    return ([u for i, u in enumerate(users) if i in chosen], [u for i, u in enumerate(users) if i not in chosen])


class _Files:
    """The second files of LEAF's word datasets (data.embeddings, data.vocabulary), read when first needed."""

    def __init__(self, embeddings: str, vocabulary: str):
        self.paths = {"embeddings": embeddings, "vocabulary": vocabulary}
        self.read = {}

    def get(self, which: str):
        if which not in self.read:
            kind = leaf_text.Embeddings if which == "embeddings" else leaf_text.Vocabulary
            self.read[which] = kind(self.paths[which])
        return self.read[which]


def _convert(samples_x: list, samples_y: list, where: str, files: _Files) -> tuple[np.ndarray, np.ndarray, str]:
    """One user's samples as arrays, and their kind: femnist | vector | characters | sent140 | reddit."""
    first = samples_x[0]
    if isinstance(first, list) and first and isinstance(first[0], list):
        return (*leaf_text.reddit_arrays(samples_x, samples_y, files.get("vocabulary"), where), "reddit")
    if isinstance(first, list) and first and isinstance(first[0], str):
        return (*leaf_text.sent140_arrays(samples_x, samples_y, files.get("embeddings"), where), "sent140")
    if isinstance(first, str):
        if any(not isinstance(s, str) or len(s) != len(first) for s in samples_x):
            raise DataError(f"data.path: {where}: character samples must all be strings of one length "
                            f"({len(first)}, the first's)")
        text = "".join(samples_x) + "".join(samples_y)
        unknown = sorted({c for c in text if c not in ALL_LETTERS})
        if unknown or any(not isinstance(c, str) or len(c) != 1 for c in samples_y):
            raise DataError(f"data.path: {where}: characters outside LEAF's Shakespeare vocabulary ({unknown[:5]}) or a "
                            "label that is not one character; LEAF maps exactly ALL_LETTERS")
        x = np.array([[ALL_LETTERS.find(c) for c in s] for s in samples_x], dtype=np.int64)
        y = np.array([ALL_LETTERS.find(c) for c in samples_y], dtype=np.int64)
        return x, y, "characters"
    try:
        x = np.asarray(samples_x, dtype=np.float64)
        y = np.asarray(samples_y)
    except OverflowError:
        raise DataError(f"data.path: {where}: x holds an integer beyond float's range; samples are float32 numbers "
                        f"(|x| <= {FLOAT32_MAX:.4g})") from None
    except (ValueError, TypeError, RecursionError):
        raise DataError(f"data.path: {where}: x must be equal-length lists of numbers (ragged or mixed rows)") from None
    if x.ndim != 2 or not np.isfinite(x).all():
        raise DataError(f"data.path: {where}: x must be equal-length lists of finite numbers, got shape {x.shape}")
    if (np.abs(x) > FLOAT32_MAX).any():  # stored as float32, where it would be inf
        sample = int(np.argmax((np.abs(x) > FLOAT32_MAX).any(axis=1)))
        raise DataError(f"data.path: {where}, sample {sample}: x holds {brief(x[sample][np.abs(x[sample]) > FLOAT32_MAX][0].item())}, "
                        f"beyond float32's range (|x| <= {FLOAT32_MAX:.4g}) in which samples are stored")
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or
                           (np.issubdtype(y.dtype, np.floating) and (y == np.round(y)).all())):
        raise DataError(f"data.path: {where}: y must be class numbers 0..K-1, got {y.dtype} {brief(y[:3].tolist())}")
    if ((y < 0) | (y > MAX_LABEL)).any():  # also inf, and 1e300 (int64 would wrap them)
        sample = int(np.argmax((y < 0) | (y > MAX_LABEL)))
        raise DataError(f"data.path: {where}, sample {sample}: label {brief(y[sample].item())} is not a class "
                        f"number 0..K-1 (K <= {MAX_LABEL + 1})")
    return x.astype(np.float32), y.astype(np.int64), "femnist" if x.shape[1] == FEMNIST_PIXELS else "vector"


def _arrays(users: list[tuple[str, dict]], file_of: dict, files: _Files) -> tuple[list, list, set]:
    xs, ys, kinds = [], [], set()
    for user, entry in users:
        if len(entry["y"]) == 0:
            xs.append(None)
            ys.append(None)
            continue
        x, y, kind = _convert(entry["x"], entry["y"], f"{file_of[user]}, user {brief(user)}", files)
        xs.append(x)
        ys.append(y)
        kinds.add(kind)
    return xs, ys, kinds


def load_leaf(path: str, split: str, seed: int, embeddings: str = "", vocabulary: str = "") -> Federated:
    train_dir, test_dir, all_dir = (os.path.join(path, d) for d in ("train", "test", "all_data"))
    digest = hashlib.sha256()
    train_files, test_files = {}, {}
    if os.path.isdir(train_dir) and os.path.isdir(test_dir):
        train, test = _read_folder(train_dir, digest, train_files), _read_folder(test_dir, digest, test_files)
    elif os.path.isdir(all_dir):
        if split not in SPLITS:
            raise DataError(f"data.leaf_split must be one of {', '.join(SPLITS)}, got {split!r}")
        users = _read_folder(all_dir, digest, train_files)
        test_files = train_files
        rng = random.Random(seed)
        train, test = split_by_sample(users, rng) if split == "sample" else split_by_user(users, rng)
    else:
        raise DataError(f"data.path {path} holds neither train/ and test/ nor all_data/: give a LEAF dataset's data/ "
                        "folder (LEAF's preprocess.sh writes them; docs/datasets.md)")
    train = [(u, e) for u, e in train if len(e["y"])]  # split_data.py keeps dropped users' empty entries
    if not train:
        raise DataError(f"data.path {path}: no user has a training sample")
    clients = [u for u, _ in train]
    position = {u: k for k, u in enumerate(clients)}
    own = [(u, e) for u, e in test if u in position]
    own_of = dict(own)
    others = [(u, e) for u, e in test if u not in position]  # a user-wise split's test users
    test_ordered = [(u, own_of.get(u, {"x": [], "y": []})) for u in clients] + others

    files = _Files(embeddings, vocabulary)
    train_xs, train_ys, kinds = _arrays(train, train_files, files)
    test_xs, test_ys, test_kinds = _arrays(test_ordered, test_files, files)
    kinds |= test_kinds
    if len(kinds) != 1:
        raise DataError(f"data.path {path}: users hold samples of different kinds ({', '.join(sorted(kinds))})")
    kind = kinds.pop()
    widths = {x.shape[1:] for x in train_xs + test_xs if x is not None}
    if len(widths) != 1:
        raise DataError(f"data.path {path}: samples differ in length ({sorted(w[0] for w in widths)})")
    width = widths.pop()
    ids = kind in ("characters", "sent140", "reddit")  # int64 token ids, else float32 numbers
    empty = np.zeros((0,) + width, dtype=np.int64 if ids else np.float32)
    empty_y = np.zeros((0,) + (width if kind == "reddit" else ()), dtype=np.int64)
    test_xs = [x if x is not None else empty for x in test_xs]
    test_ys = [y if y is not None else empty_y for y in test_ys]
    dtype = np.int64 if ids else np.float32
    train_x, train_y, train_offsets = concatenate(train_xs, train_ys, dtype)
    test_x, test_y, test_offsets = concatenate(test_xs, test_ys, dtype)
    test_offsets = test_offsets[:len(clients) + 1]
    sources = {"data.path": (path, digest.hexdigest())}
    table, tokens = None, None
    if kind == "characters":
        num_classes = len(ALL_LETTERS)
    elif kind == "sent140":
        read = files.get("embeddings")
        num_classes, table = leaf_text.SENT140_CLASSES, read.table
        sources["data.embeddings"] = (read.path, read.sha256)
    elif kind == "reddit":
        read = files.get("vocabulary")
        num_classes, tokens = read.size, read.task
        sources["data.vocabulary"] = (files.paths["vocabulary"], read.sha256)
    elif kind == "femnist":
        train_x, test_x = train_x.reshape(-1, 1, 28, 28), test_x.reshape(-1, 1, 28, 28)
        num_classes = FEMNIST_CLASSES
    else:
        train_x, test_x = train_x.reshape(-1, 1, 1, width[0]), test_x.reshape(-1, 1, 1, width[0])
        num_classes = int(max(train_y.max(), test_y.max(initial=0))) + 1
    top = int(max(train_y.max(), test_y.max(initial=0)))
    if top >= num_classes:
        raise DataError(f"data.path {path}: label {top} is beyond the {num_classes} classes of {kind} samples")
    return Federated(train_x, train_y, train_offsets, test_x, test_y, test_offsets, num_classes, f"leaf-{kind}",
                     client_ids=clients, sources=sources, tokens=tokens, embeddings=table)
