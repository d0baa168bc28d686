"""Reading a user's .npz file (data.path, partition.path) with every way it can be unreadable named."""
from __future__ import annotations

import os
import zipfile
import zlib
from contextlib import contextmanager

from distfl.errors import DataError

# An .npz is a zip archive: an empty file ends np.load in EOFError, a truncated one in BadZipFile (no
# central directory), a damaged member in BadZipFile (bad CRC) or zlib.error, a non-array member in ValueError.
READ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error)


@contextmanager
def npz_errors(key: str, path: str):
    """Turn a failure to read the .npz at `path` (the value of config key `key`) into one DataError line."""
    try:
        yield
    except READ_ERRORS as exc:
        raise DataError(f"cannot read {key} {path} as an .npz file: {_why(exc, path, key)}") from None


def _why(exc: BaseException, path: str, key: str) -> str:
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    if size == 0:
        return "it is empty (0 bytes)"
    if isinstance(exc, (EOFError, zipfile.BadZipFile, zlib.error)):
        return f"{exc or type(exc).__name__} (is it truncated? {size} bytes; write it again)"
    if isinstance(exc, ValueError) and "pickled" in str(exc):
        # np.load takes whatever is neither a zip archive nor an .npy array for a pickle.
        return _what_it_is(path, key)
    return str(exc) or type(exc).__name__


def _what_it_is(path: str, key: str) -> str:
    """What a file that np.load took for a pickle really is, by its first bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError as exc:
        return exc.strerror or str(exc)
    save = ("write it with np.savez(path, client_0=..., client_1=..., ...)" if key == "partition.path" else
            "write it with np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)")
    if head[:1] == b"\x80":
        return f"it holds pickled Python objects, which distfl never loads (unpickling can run code); {save}"
    text = head.decode("utf-8", "replace")[:-1]  # its last character may be cut in two
    if all(c.isprintable() or c in "\r\n\t" for c in text) and "\ufffd" not in text:
        first = text.splitlines()[0] if text.strip() else ""
        return f"it is a text file, not an .npz (zip) archive of arrays (it begins {first[:60]!r}); {save}"
    return f"it is not an .npz (zip) archive of arrays (its first bytes: {head[:8].hex(' ')}); {save}"
