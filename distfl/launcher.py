"""Ranks that outlive their launcher (torchrun killed with SIGKILL, or by a signal it does not handle).

A torchrun worker's parent is its launcher. `import distfl` records that parent (`LAUNCHER`) as the
worker's first act, before torch loads, and starts a watcher thread that looks at `os.getppid()` every
`POLL_S` seconds: the kernel re-parents an orphan, so a changed parent means the launcher is gone.

- During start-up (imports, the process group's rendezvous, data, set-up: until the round loop begins)
  the rank stops at once: one line on its stderr, exit status 3. It has written nothing a later
  launch needs, and it must not wait on the dead launcher's store or, worse, join the store of a
  relaunch on the same port. The thread runs while the main thread waits in torch's rendezvous (torch
  releases the GIL there), so this holds at any moment of start-up.
- During training, the main thread sees `gone()` at the next round boundary and stops as on SIGTERM:
  the round in progress is finished and checkpointed. If the rank is still running `GRACE_S` seconds
  after the launcher went (a long round, a peer that died), the thread ends it with one line: the
  same 30 s that torchrun's agent grants its ranks after a SIGTERM.

So an orphaned rank stops within POLL_S (+ the time a C extension holds the GIL, under a second)
during start-up, and within GRACE_S + POLL_S during training. A plain process (no torchrun) is not
watched: `nohup distfl train ... &` outlives its shell.
"""
from __future__ import annotations

import os
import sys
import threading
import time

POLL_S = 0.2
GRACE_S = 30.0
EXIT_STATUS = 3

# The launcher's pid, recorded when distfl is first imported in a torchrun worker; None otherwise.
LAUNCHER: int | None = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None

START_UP_LINE = ("the launcher (torchrun, pid {pid}) is gone during start-up: stopping now; this launch "
                 "wrote no checkpoint (run the command again)")

_training = threading.Event()
_gone = threading.Event()
_thread: threading.Thread | None = None


def gone() -> bool:
    """Whether this torchrun worker's launcher has died."""
    return _gone.is_set() or (LAUNCHER is not None and os.getppid() != LAUNCHER)


def training(on: bool = True) -> None:
    """The round loop begins (on) or ends: from now on a dead launcher costs the round in progress,
    which is checkpointed, instead of stopping the rank at once."""
    if on:
        _training.set()
    else:
        _training.clear()


def _say_and_exit(line: str) -> None:
    try:
        sys.stderr.write(f"distfl: rank {os.environ.get('RANK', '?')}: {line}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_STATUS)


def _watch() -> None:
    while os.getppid() == LAUNCHER:
        time.sleep(POLL_S)
    _gone.set()
    if not _training.is_set():
        _say_and_exit(START_UP_LINE.format(pid=LAUNCHER))
    time.sleep(GRACE_S)
    _say_and_exit(f"the launcher (torchrun, pid {LAUNCHER}) has been gone {GRACE_S:g}s and this rank has not "
                  "finished its round and checkpoint: stopping without it (resume from the last checkpoint)")


def exit_if_orphaned() -> None:
    """On an error during start-up: if the launcher is gone, say so and stop, as the watcher would.
    Its death breaks the rendezvous at once (its store closes), so the error can come first; the
    kernel re-parents this process a moment later, so wait up to 1 s to see it."""
    if LAUNCHER is None or _training.is_set():
        return
    for _ in range(5):
        if gone():
            _say_and_exit(START_UP_LINE.format(pid=LAUNCHER))
        time.sleep(POLL_S)


def start_watch() -> None:
    """Watch the launcher of this torchrun worker (idempotent; nothing for a plain process)."""
    global _thread
    if LAUNCHER is None or _thread is not None:
        return
    _thread = threading.Thread(target=_watch, name="distfl-launcher-watch", daemon=True)
    _thread.start()
