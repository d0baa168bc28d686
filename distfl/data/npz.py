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
        raise DataError(f"cannot read {key} {path} as an .npz file: {_why(exc, path)}") from None


def _why(exc: BaseException, path: str) -> str:
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    if size == 0:
        return "it is empty (0 bytes)"
    if isinstance(exc, (EOFError, zipfile.BadZipFile, zlib.error)):
        return f"{exc or type(exc).__name__} (is it truncated? {size} bytes; write it again)"
    return str(exc) or type(exc).__name__
