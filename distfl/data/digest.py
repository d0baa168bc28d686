"""A data file's SHA-256 taken in a background thread, so a run's start-up does not wait for it.

A prepared folder (data/prepared.py) can hold gigabytes; its hash is what a resume compares to refuse
changed data. `PendingDigest` starts hashing when the folder is opened and `result()` waits for it. The
run asks for it when it first needs the value: its first checkpoint and its summary (a fresh run, by
then done in the background while the first round trained), and before any training on resume (the
comparison with the checkpoint's). hashlib and file reads release the GIL, so the hash runs beside the
training on another core; on Linux its thread runs 10 nice levels below the training, so on a busy
machine the rounds keep their speed and the hash takes the idle time. `DataSources` is the run's
role -> {"path", "sha256"} map with the pending values waited for on read.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping


class PendingDigest:
    """`compute()` run in a daemon thread from construction; `result()` waits and returns its value
    (or raises what it raised)."""

    def __init__(self, compute: Callable[[], str]):
        self._value: str | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(compute,), name="distfl-data-sha256", daemon=True)
        self._thread.start()

    def _run(self, compute: Callable[[], str]) -> None:
        if sys.platform.startswith("linux"):  # Linux keeps a nice value per thread: the training goes first
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10))
            except OSError:
                pass
        try:
            self._value = compute()
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class DataSources(Mapping):
    """role -> {"path", "sha256"} of every file a run read, from (path, digest) pairs whose digest is a
    string or a PendingDigest (waited for when the role is read: `dict(sources.items())` is the plain record
that checkpoints and summary.json hold)."""

    def __init__(self, sources: dict):
        self._sources = dict(sources)

    def add(self, role: str, path: str, digest) -> None:
        self._sources[role] = (path, digest)

    def __getitem__(self, role: str) -> dict:
        path, digest = self._sources[role]
        return {"path": path, "sha256": digest if isinstance(digest, str) else digest.result()}

    def __iter__(self):
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)
