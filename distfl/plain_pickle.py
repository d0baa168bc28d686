"""Reading pickles of plain data safely: FedScale's device traces (distfl/system/traces.py) and LEAF's
Reddit vocabulary (distfl/data/leaf_text.py) ship as pickles.

A pickle can name any importable callable, and loading it calls that callable, so these are read by an
unpickler that resolves no name at all except numpy's numeric scalars (and the latin-1 bytes protocol 2
stores them in): plain dicts, lists, tuples, strings and numbers load; anything else is refused before it
is built. What loads is then measured before anyone walks it: a pickle can share one list many times
(`s = [0]`, then 30 times `s = [s, s]` is 200 bytes and a tree of 2^30 leaves to whoever walks it), so a
file whose values, counted as a walk would reach them, outnumber its bytes (each value a plain pickle holds
takes at least one byte) is refused, and so is nesting deeper than MAX_DEPTH or a container holding itself.
`brief` is how a value from such a file appears in an error line: cut short, never printed whole.
`convert_command` is the `python -m MODULE convert IN OUT.json` both offer.
"""
from __future__ import annotations

import io
import json
import pickle
import reprlib
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


# Traces and vocabularies nest 3 levels; JSON's and pickle's readers allow far deeper files.
MAX_DEPTH = 32
# Values a file may hold beyond one per byte (tiny files).
SLACK = 1024

_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxtuple, _BRIEF.maxdict, _BRIEF.maxset = 2, 4, 4, 4, 4
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 60, 60, 40


def brief(value) -> str:
    """`value`'s repr cut short (a few items, two levels, 60 characters a string): for error lines."""
    return _BRIEF.repr(value)


class _Shape(Exception):
    pass


_CONTAINERS = (list, tuple, dict, set, frozenset)
_TYPES = frozenset(_CONTAINERS)


def _holds_containers(container) -> bool:
    # the unpickler and JSON build these exact types, never subclasses
    if isinstance(container, dict):
        return not (_TYPES.isdisjoint(map(type, container.values())) and _TYPES.isdisjoint(map(type, container)))
    return not _TYPES.isdisjoint(map(type, container))


def _items(container) -> list:
    return [c for pair in container.items() for c in pair] if isinstance(container, dict) else container


def _measure(value, depth: int, seen: dict, open_ids: set, limit: int) -> tuple[int, int]:
    """(values a walk of container `value` reaches, counting a shared container each time; the levels of
    containers it nests), each distinct container holding containers measured once."""
    key = id(value)
    if key in open_ids:
        raise _Shape("a container holds itself")
    if key not in seen:
        if depth > MAX_DEPTH:
            raise _Shape(f"values nest deeper than {MAX_DEPTH} levels")
        open_ids.add(key)
        items = _items(value)
        count, height = 1 + len(items), 1
        for child in items:
            if not isinstance(child, _CONTAINERS):
                continue
            if _holds_containers(child):
                size, below = _measure(child, depth + 1, seen, open_ids, limit)
                count, height = count + size - 1, max(height, below + 1)
            else:  # a container of plain values (a trace's millions of entries): counted here, no call
                count, height = count + len(child) * (2 if isinstance(child, dict) else 1), max(height, 2)
            if count > limit:
                raise _Shape(f"it shares values so that a walk of it reaches more than {limit} of them (a file "
                             "of plain data holds at most about one value per byte)")
        open_ids.discard(key)
        seen[key] = (count, height)
    count, height = seen[key]
    if depth + height > MAX_DEPTH:
        raise _Shape(f"values nest deeper than {MAX_DEPTH} levels")
    return count, height


def check_shape(value, size_bytes: int) -> None:
    """_Shape if `value`, read from a file of `size_bytes`, expands past one value a byte (shared
    references), nests deeper than MAX_DEPTH or holds itself."""
    if isinstance(value, _CONTAINERS):
        _measure(value, 0, {}, set(), size_bytes + SLACK)


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
            data = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc})") from None
        except RecursionError:
            raise ConfigError(f"{path} was refused as {what}: values nest deeper than {MAX_DEPTH} levels") from None
    else:
        try:
            data = PlainUnpickler(io.BytesIO(raw)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
                KeyError, RecursionError, MemoryError) as exc:
            raise ConfigError(f"{path} was refused as {what}: {str(exc)[:200]}") from None
    try:
        check_shape(data, len(raw))
    except _Shape as exc:
        raise ConfigError(f"{path} was refused as {what}: {exc}") from None
    return data


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
