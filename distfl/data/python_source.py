"""`distfl data prepare python --from DIR`: Python source code as a next-token federation whose clients are
the packages of DIR, read as bytes (data/tokens.py), for code completion.

The corpus this is made for is the Python standard library's own source, which every Python installation
holds: `python -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])"` prints its folder (Debian's
package `libpython3.11-stdlib` puts it in /usr/lib/python3.11). Any folder of Python packages reads the same.

- Clients: the packages directly under DIR (sub-folders holding an `__init__.py`), in name order, or only
  those named by `packages`. A package's own tests (sub-folders named `test` or `tests`) and `__pycache__`
  are left out; DIR's `test` package (CPython's test suite), `site-packages` and `dist-packages` are never
  clients unless named.
- A client's text: its `.py` files, in the order of their paths (sorted), each file's bytes followed by one
  newline, concatenated.
- Tokens: each byte b is token b + 1 (1 to 256); token 0 is padding (none is produced), so the vocabulary is
  257. Bytes, not characters: any file reads, whatever its encoding.
- Samples: the text cut into consecutive windows of L + 1 bytes that overlap by one (window k starts at byte
  k L): the input is its first L tokens, the targets its last L (each position's next byte); the rest after
  the last whole window is dropped. Every tenth window (k = 9, 19, ...) is the client's test sample, the
  others its training samples, so every package is in both splits.
"""
from __future__ import annotations

import os

import numpy as np

from distfl.data.natural import Federated, concatenate
from distfl.data.tokens import TokenTask
from distfl.errors import DataError

VOCABULARY = 257  # 256 byte values + padding (token 0)
DEFAULT_LENGTH = 64  # input tokens a sample when --sequence-length is 0
TEST_EVERY = 10  # every tenth window is a test sample
SKIPPED_DIRS = ("__pycache__", "test", "tests")  # never read inside a package
NOT_CLIENTS = ("test", "site-packages", "dist-packages")  # DIR's folders that are clients only when named


def packages_in(folder: str) -> list[str]:
    """The package folders directly under `folder`, in name order."""
    if not os.path.isdir(folder):
        raise DataError(f"distfl data prepare python: --from {folder} is not a folder; give a folder of Python "
                        "packages, e.g. the standard library's: python -c \"import sysconfig; "
                        "print(sysconfig.get_paths()['stdlib'])\"")
    return sorted(name for name in os.listdir(folder)
                  if os.path.isfile(os.path.join(folder, name, "__init__.py")))


def package_bytes(path: str) -> bytes:
    """The `.py` files under `path` (tests and caches left out), in path order, each followed by a newline."""
    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        files += [os.path.join(root, n) for n in names if n.endswith(".py")]
    chunks = []
    for file in sorted(os.path.relpath(f, path) for f in files):
        with open(os.path.join(path, file), "rb") as f:
            chunks.append(f.read() + b"\n")
    return b"".join(chunks)


def windows(text: bytes, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), int64 K x L each: the consecutive windows of L + 1 bytes of `text`, as tokens."""
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.int64) + 1
    count = max((len(tokens) - 1) // length, 0)
    starts = np.arange(count) * length
    x = tokens[starts[:, None] + np.arange(length)]
    y = tokens[starts[:, None] + np.arange(1, length + 1)]
    return x.reshape(count, length), y.reshape(count, length)


def load_python_source(folder: str, packages: list[str] | tuple[str, ...] = (), sequence_length: int = 0) -> Federated:
    """The federation of the packages under `folder` (all of them but NOT_CLIENTS, or those named)."""
    length = sequence_length or DEFAULT_LENGTH
    found = packages_in(folder)
    if packages:
        missing = [p for p in packages if p not in found]
        if missing:
            raise DataError(f"distfl data prepare python: --packages names {missing[0]!r}, which is not a package "
                            f"of {folder} (a folder with an __init__.py); its packages: {', '.join(found[:30])}"
                            f"{', ...' if len(found) > 30 else ''}")
        names = sorted(set(packages))
    else:
        names = [p for p in found if p not in NOT_CLIENTS]
    if not names:
        raise DataError(f"distfl data prepare python: {folder} holds no Python package (a folder with an __init__.py)")
    train, test, kept = ([], []), ([], []), []
    for name in names:
        x, y = windows(package_bytes(os.path.join(folder, name)), length)
        is_test = np.arange(len(x)) % TEST_EVERY == TEST_EVERY - 1
        if is_test.sum() == 0:  # under 10 windows: too small to be scored, left out
            continue
        kept.append(name)
        for split, rows in ((train, ~is_test), (test, is_test)):
            split[0].append(x[rows])
            split[1].append(y[rows])
    if not kept:
        raise DataError(f"distfl data prepare python: no package of {folder} has {TEST_EVERY} windows of "
                        f"{length + 1} bytes; give a shorter --sequence-length or larger packages")
    train_x, train_y, train_offsets = concatenate(*train, x_dtype=np.int64)
    test_x, test_y, test_offsets = concatenate(*test, x_dtype=np.int64)
    return Federated(train_x, train_y, train_offsets, test_x, test_y, test_offsets, VOCABULARY, "python_source",
                     client_ids=kept, tokens=TokenTask("python_source", (0,)),
                     text={"sequence_length": length})
