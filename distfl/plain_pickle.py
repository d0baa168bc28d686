"""Reading pickles of plain data safely: FedScale's device traces (distfl/system/traces.py) and LEAF's
Reddit vocabulary (distfl/data/leaf_text.py) ship as pickles.

A pickle can name any importable callable, and loading it calls that callable, so these are read by an
unpickler that resolves no name at all except numpy's numeric scalars (and the latin-1 bytes protocol 2
stores them in): plain dicts, lists, tuples, strings and numbers load; anything else is refused before it
is built. `convert_command` is the `python -m MODULE convert IN OUT.json` both offer.
"""
from __future__ import annotations

import io
import json
import pickle
import sys
from pathlib import Path

import numpy as np

from .errors import ConfigError, DistflError


def _numpy_scalar(dtype, data=None):
    """numpy's pickled scalar, for numeric dtypes only (a bool, an integer or a float)."""
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biuf" or not isinstance(data, bytes):
        raise pickle.UnpicklingError("a numpy scalar of a non-numeric type")
    return np.frombuffer(data, dtype=dtype, count=1)[0].item()


def _numpy_dtype(kind, align=False, copy=True):
    if not isinstance(kind, str) or np.dtype(kind).kind not in "biuf":
        raise pickle.UnpicklingError(f"a numpy dtype {kind!r} that is not a number")
    return np.dtype(kind)


def _latin1_bytes(text, encoding="latin1"):
    """How pickle protocol 2 stores bytes (a numpy scalar's): _codecs.encode(str, 'latin1')."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("an encoding call other than protocol 2's bytes")
    return text.encode("latin1")


_ALLOWED = {("numpy.core.multiarray", "scalar"): _numpy_scalar, ("numpy._core.multiarray", "scalar"): _numpy_scalar,
            ("numpy", "dtype"): _numpy_dtype, ("_codecs", "encode"): _latin1_bytes}


class PlainUnpickler(pickle.Unpickler):
    """Loads plain containers, strings and numbers; refuses every other object before it is built."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        raise pickle.UnpicklingError(f"it names {module}.{name}, and only plain data (dicts, lists, strings, "
                                     "numbers) is read from a pickle here")


def load_plain(path: str, what: str = "a FedScale trace"):
    """A file's content: JSON, or a pickle of plain data (a FedScale trace; LEAF's Reddit vocabulary,
    data/leaf_text.py). ConfigError naming the file and `what` it was read as otherwise."""
    raw = Path(path).read_bytes()
    if raw[:1] in (b"{", b"[") or raw[:1].isspace():
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc})") from None
    try:
        return PlainUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} was refused as {what}: {exc}") from None


def convert_command(argv: list[str], usage: str, convert_file, noun: str) -> int:
    """`python -m MODULE convert IN OUT.json` of a plain-data pickle (this module's traces, LEAF's Reddit
    vocabulary): exit status 0, or 2 with one line."""
    if len(argv) != 3 or argv[0] != "convert":
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    try:
        count = convert_file(argv[1], argv[2])
    except (DistflError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count} {noun} to {argv[2]}")
    return 0
