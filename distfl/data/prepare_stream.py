"""`distfl data prepare tff` for TFF's text federations in bounded memory: client by client from the HDF5
files into the prepared folder's .npy files (data/prepared.py), the same bytes as preparing the whole
federation in memory (data/tff_text.py `load_tff_folder`, then `write_prepared`).

Two passes over each file. The first counts every client's samples (a StackOverflow client's sentences
from its dataset's shape, without reading them; a Shakespeare client's pieces by cutting its snippets),
which fixes the offsets and every client's first row. The second tokenises one client at a time and
writes its rows at their place in train_x/train_y (test_x/test_y): each .npy file is created with numpy's
own header for its final shape and filled by seek and write. Memory holds one client's samples, the
vocabulary, and per client its id and offsets (some 100 bytes a client), never the samples of the
federation: the full StackOverflow (135.8 M training sentences, 43 GB of arrays) no longer needs 43 GB.
"""
from __future__ import annotations

import os

import numpy as np

from distfl.data.natural import Federated
from distfl.data.prepared import check_out, read_source, staging, write_meta, write_prepared
from distfl.data.tff import TEXT, client_groups, find_federation
from distfl.data.tff_text import TextFederation, text_federation
from distfl.errors import DataError


def _counts(fed: TextFederation, path: str) -> tuple[list[str], np.ndarray]:
    """(client ids in sorted order, int64 samples of each) of one file, nothing tokenised that need not be."""
    ids, counts = [], []
    for client, group in client_groups(path, (fed.feature,)):
        ids.append(client)
        counts.append(fed.count(path, client, group))
    if not ids:
        raise DataError(f"data.path: {path}: 'examples' holds no client")
    return ids, np.asarray(counts, dtype=np.int64)


class _RowFile:
    """An int64 rows x width .npy file, its header numpy's (np.save's) for that shape, filled by row ranges."""

    def __init__(self, path: str, rows: int, width: int):
        self.file = open(path, "wb")
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)), "fortran_order": False,
                  "shape": (rows, width)}
        np.lib.format.write_array_header_1_0(self.file, header)
        self.start, self.row_bytes = self.file.tell(), width * 8
        self.file.truncate(self.start + rows * self.row_bytes)

    def write(self, row: int, values: np.ndarray) -> None:
        self.file.seek(self.start + row * self.row_bytes)
        self.file.write(np.ascontiguousarray(values, dtype=np.int64).tobytes())

    def close(self) -> None:
        self.file.close()


def _fill(fed: TextFederation, path: str, folder: str, split: str, first_row: dict[str, int], rows: int) -> None:
    """Tokenise every client of `path` and write its samples at first_row[client] of split_x, split_y."""
    width = fed.settings["sequence_length"]
    files = [_RowFile(os.path.join(folder, f"{split}_{a}.npy"), rows, width) for a in ("x", "y")]
    try:
        for client, group in client_groups(path, (fed.feature,)):
            for out, values in zip(files, fed.samples(path, client, group)):
                out.write(first_row[client], values)
    finally:
        for out in files:
            out.close()


def prepare_text(fed: TextFederation, out: str, source: str, origin: str) -> None:
    """Write TFF text federation `fed` to the prepared folder `out`."""
    ids, train_counts = _counts(fed, fed.train_path)
    if (train_counts == 0).any():
        raise DataError(f"data.path: {fed.train_path}: client {ids[int(np.argmax(train_counts == 0))]!r} has no "
                        "training sample")
    test_ids, test_counts = _counts(fed, fed.test_path)
    # the training clients' own test samples first, in client order; test-only clients after them
    position = {c: k for k, c in enumerate(ids)}
    rank = np.asarray([position.get(c, len(ids) + j) for j, c in enumerate(test_ids)], dtype=np.int64)
    by_rank = np.zeros(len(ids) + len(test_ids), dtype=np.int64)
    by_rank[rank] = test_counts
    test_starts = np.concatenate([[0], np.cumsum(by_rank)])
    train_offsets = np.concatenate([[0], np.cumsum(train_counts)]).astype(np.int64)
    test_offsets = test_starts[:len(ids) + 1].astype(np.int64)
    with staging(out) as tmp:
        _fill(fed, fed.train_path, tmp, "train", dict(zip(ids, train_offsets[:-1].tolist())), int(train_offsets[-1]))
        _fill(fed, fed.test_path, tmp, "test", dict(zip(test_ids, test_starts[rank].tolist())), int(test_starts[-1]))
        for key, value in (("train_offsets", train_offsets), ("test_offsets", test_offsets),
                           ("client_ids", np.asarray(ids, dtype=str))):
            np.save(os.path.join(tmp, f"{key}.npy"), value, allow_pickle=False)
        empty = np.zeros(0, np.int64)
        write_meta(tmp, Federated(empty, empty, train_offsets, empty, empty, test_offsets, fed.classes,
                                  f"tff_{fed.prefix}", tokens=fed.task, text=fed.settings), source, origin)


def prepare(name: str, folder: str, out: str, split: str = "sample", seed: int = 0, embeddings: str = "",
            vocabulary: str = "", sequence_length: int = 0, oov_buckets: int = 0,
            packages: tuple[str, ...] = ()) -> None:
    """`distfl data prepare NAME --from folder --out out`: TFF's text federations client by client, the
    others (LEAF, TFF's images) read whole and written (prepared.write_prepared)."""
    check_out(out)  # before reading the source, which can take minutes
    if name == "tff" and find_federation(folder) in TEXT:
        prefix = find_federation(folder)
        prepare_text(text_federation(folder, prefix, sequence_length, oov_buckets), out, name, folder)
    else:
        write_prepared(read_source(name, folder, split, seed, embeddings, vocabulary, sequence_length, oov_buckets,
                                   packages), out, name, folder)
