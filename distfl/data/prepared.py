"""`distfl data prepare NAME --from DIR --out OUT`: a natural federation read once from its published
files (LEAF's JSON takes minutes to parse) and written as a folder of plain .npy arrays that a run
memory-maps (`data.dataset: prepared`, `data.path: OUT`):

    OUT/meta.json        {"format": "distfl-prepared-1", "name", "num_classes", "num_clients", "source", "from",
                          and for a next-token dataset "tokens": {"name", "unscored"} (data/tokens.py); for TFF's
                          text federations "sequence_length" and (StackOverflow) "oov_buckets"}
    OUT/train_x.npy      every client's training inputs, client after client (float32 or int64)
    OUT/train_y.npy      int64 labels
    OUT/train_offsets.npy  int64, clients + 1: client k holds rows train_offsets[k]:train_offsets[k + 1]
    OUT/test_x.npy, test_y.npy, test_offsets.npy   the same for the test split (test_offsets: the clients'
                         own test rows; rows after test_offsets[-1] belong to no training client)
    OUT/client_ids.npy   the source's client names (a fixed-width unicode array: no pickle)
    OUT/embeddings.npy   float32 V x D, for LEAF's Sent140 only: the word vectors of data.embeddings (meta.json
                         "embeddings": {"from", "sha256"} names the embs.json they were read from; "vocabulary"
                         the same for Reddit's vocabulary file)

A run opens the arrays with np.load(mmap_mode="c"): pages are read when a batch touches them, so opening
costs the same for 1,000 clients as for 342,477. The SHA-256 of the folder's files is recorded in the
run's checkpoints like any data file's, and a resume refuses a folder whose bytes changed. It is taken in
a background thread from the moment the folder is opened (data/digest.py): a fresh run's first
checkpoint waits for it, a resume waits for it before training, start-up never does.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
from contextlib import contextmanager

import numpy as np

from distfl.data.digest import PendingDigest
from distfl.data.natural import Federated
from distfl.data.tokens import TokenTask
from distfl.errors import DataError

FORMAT = "distfl-prepared-1"
ARRAYS = ("train_x", "train_y", "train_offsets", "test_x", "test_y", "test_offsets", "client_ids")
SOURCES = ("leaf", "tff", "python")
TEXT_SETTINGS = ("sequence_length", "oov_buckets")  # meta.json's record of how TFF's text was tokenised


def read_source(name: str, folder: str, split: str, seed: int, embeddings: str = "", vocabulary: str = "",
                sequence_length: int = 0, oov_buckets: int = 0, packages: tuple[str, ...] = ()) -> Federated:
    if packages and name != "python":
        raise DataError("--packages picks the packages of a source-code folder (distfl data prepare python)")
    if name == "leaf" and (sequence_length or oov_buckets):
        raise DataError("--sequence-length and --oov-buckets tokenise TFF's text federations (distfl data prepare tff); "
                        "LEAF's data is read as it is")
    if name == "leaf":
        from distfl.data.leaf import load_leaf

        return load_leaf(folder, split, seed, embeddings, vocabulary)
    if name == "tff":
        from distfl.data.tff_text import load_tff_folder

        return load_tff_folder(folder, sequence_length, oov_buckets)
    if name == "python":
        from distfl.data.python_source import load_python_source

        return load_python_source(folder, packages, sequence_length)
    raise DataError(f"distfl data prepare: unknown dataset {name!r}; valid: {', '.join(SOURCES)}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def check_out(out: str) -> None:
    """Before any work: DataError if `out` exists; the temporary folders a killed `distfl data prepare`
    left beside it (OUT.HOST.PID.tmp of this host whose process is gone; OUT.PID.tmp, as earlier versions
    named them) are removed, each with a line."""
    if os.path.exists(out):
        raise DataError(f"--out {out} exists; remove it or give another folder")
    folder, name = os.path.split(os.path.abspath(out))
    pattern = re.compile(re.escape(name) + r"\.(?:(?P<host>.+)\.)?(?P<pid>\d+)\.tmp")
    for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        found = pattern.fullmatch(entry)
        if found and found["host"] in (None, socket.gethostname()) and _gone(int(found["pid"])):
            shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)
            print(f"removed {os.path.join(folder, entry)}, left by a `distfl data prepare` that was killed "
                  f"(process {found['pid']} is gone)", file=sys.stderr, flush=True)


@contextmanager
def staging(out: str):
    """A temporary folder beside `out` (OUT.HOST.PID.tmp), renamed to `out` when the block ends well, removed
    otherwise."""
    check_out(out)
    tmp = f"{out}.{socket.gethostname()}.{os.getpid()}.tmp"
    try:
        os.makedirs(tmp)
        yield tmp
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_meta(folder: str, fed: Federated, source: str, origin: str) -> None:
    """meta.json of `fed` (its arrays may be empty: only its name, classes, clients, tokens and text are read)."""
    meta = {"format": FORMAT, "name": fed.name, "num_classes": int(fed.num_classes),
            "num_clients": int(fed.num_clients), "source": source, "from": os.path.abspath(origin)}
    if fed.tokens is not None:  # a next-token dataset: its special tokens (absent for classification)
        meta["tokens"] = fed.tokens.to_json()
    meta.update(fed.text or {})  # how TFF's text was tokenised: a run asking for another is refused
    for key in ("embeddings", "vocabulary"):  # LEAF's Sent140, Reddit: the file the words' ids came from
        if f"data.{key}" in fed.sources:
            path, sha = fed.sources[f"data.{key}"]
            meta[key] = {"from": os.path.abspath(path), "sha256": sha}
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


def write_prepared(fed: Federated, out: str, source: str, origin: str) -> None:
    """Write `fed` to the folder `out` atomically (a temporary folder renamed into place)."""
    with staging(out) as tmp:
        arrays = {"train_x": fed.train_x, "train_y": fed.train_y, "train_offsets": fed.train_offsets,
                  "test_x": fed.test_x, "test_y": fed.test_y, "test_offsets": fed.test_offsets,
                  "client_ids": np.asarray(fed.client_ids, dtype=str)}
        if fed.embeddings is not None:
            arrays["embeddings"] = fed.embeddings
        for key, value in arrays.items():
            np.save(os.path.join(tmp, f"{key}.npy"), np.ascontiguousarray(value), allow_pickle=False)
        write_meta(tmp, fed, source, origin)


def folder_sha256(folder: str) -> str:
    """One SHA-256 over meta.json and the arrays: each name and its bytes' SHA-256, in a fixed order."""
    digest = hashlib.sha256()
    extra = ("embeddings.npy",) if os.path.exists(os.path.join(folder, "embeddings.npy")) else ()
    for name in ("meta.json",) + tuple(f"{a}.npy" for a in ARRAYS) + extra:
        file_digest = hashlib.sha256()
        with open(os.path.join(folder, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                file_digest.update(block)
        digest.update(name.encode() + b"\0" + file_digest.hexdigest().encode())
    return digest.hexdigest()


def read_meta(folder: str) -> dict:
    """A prepared folder's meta.json; DataError (one line) for anything that is not one."""
    meta_path = os.path.join(folder, "meta.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise DataError(f"data.path {folder} is not a prepared dataset (`distfl data prepare` writes one): cannot "
                        f"read its meta.json ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"data.path {folder}: meta.json is not of format {FORMAT}; prepare the dataset again")
    return meta


def load_prepared(folder: str) -> Federated:
    """A prepared folder, memory-mapped; DataError (one line) for anything that is not one."""
    meta = read_meta(folder)
    arrays = {}
    for key in ARRAYS:
        path = os.path.join(folder, f"{key}.npy")
        try:
            arrays[key] = np.load(path, mmap_mode="c" if key != "client_ids" else "r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"data.path {folder}: cannot read {key}.npy ({exc}); prepare the dataset again") from None
    embeddings = None
    if "embeddings" in meta:
        try:
            embeddings = np.load(os.path.join(folder, "embeddings.npy"), allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"data.path {folder}: cannot read embeddings.npy ({exc}); prepare the dataset again") from None
        if embeddings.ndim != 2 or embeddings.dtype != np.float32:
            raise DataError(f"data.path {folder}: embeddings.npy must be float32 V x D; prepare the dataset again")
    train_off, test_off = arrays["train_offsets"], arrays["test_offsets"]
    clients = int(meta.get("num_clients", -1))
    for key, off, rows in (("train", train_off, len(arrays["train_y"])), ("test", test_off, len(arrays["test_y"]))):
        if off.ndim != 1 or len(off) != clients + 1 or off[0] != 0 or (np.diff(off) < 0).any() or off[-1] > rows:
            raise DataError(f"data.path {folder}: {key}_offsets must rise from 0 to at most {rows} over "
                            f"{clients} + 1 entries; prepare the dataset again")
        if len(arrays[f"{key}_x"]) != rows or arrays[f"{key}_y"].dtype != np.int64:
            raise DataError(f"data.path {folder}: {key}_x and {key}_y differ in length or {key}_y is not int64")
    if train_off[-1] != len(arrays["train_y"]):
        raise DataError(f"data.path {folder}: train_offsets end at {train_off[-1]} but train_y has "
                        f"{len(arrays['train_y'])} rows")
    return Federated(arrays["train_x"], arrays["train_y"], train_off, arrays["test_x"], arrays["test_y"], test_off,
                     int(meta["num_classes"]), str(meta["name"]), client_ids=arrays["client_ids"],
                     sources={"data.path": (folder, PendingDigest(lambda: folder_sha256(folder)))},
                     tokens=TokenTask.from_json(meta["tokens"]) if "tokens" in meta else None,
                     text={k: int(meta[k]) for k in TEXT_SETTINGS if k in meta} or None, embeddings=embeddings)


def describe(fed: Federated) -> str:
    sizes = np.diff(fed.train_offsets)
    return (f"{fed.num_clients} clients, {len(fed.train_y)} training samples (per client min/median/max "
            f"{sizes.min()}/{int(np.median(sizes))}/{sizes.max()}), {len(fed.test_y)} test samples "
            f"({int(fed.test_offsets[-1])} in the clients' own test splits), {fed.num_classes} "
            f"{'classes' if fed.tokens is None else 'tokens (next-token sequences: ' + fed.tokens.name + ')'}, "
            f"inputs {tuple(fed.train_x.shape[1:])} {fed.train_x.dtype}")
