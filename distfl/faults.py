"""Faults during a run, each ended by one line: what failed and where, and what to do next.

An unexpected error in a run is reported as one line naming the round, phase or client where it
happened and the file in the run directory that holds its full traceback (`error.log`, or
`error.rankN.log` for rank N > 0); the traceback itself is printed only with `--debug` or
DISTFL_DEBUG=1. Under torchrun the rank that failed reports it; a rank whose collective then broke
because that rank was gone stays quiet (the failing rank leaves a note in the process group's store,
and its log file, before it exits). A full disk gets its own message: the file that could not be
written, the filesystem and its free space, the last good checkpoint and the command that continues.
"""
from __future__ import annotations

import errno
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

from .errors import ConfigError, DistflError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
STORE_KEY = "distfl/failed"


class RunFailed(DistflError):
    """An unexpected error ended a run: the message is the one line, `original` the exception,
    `quiet` whether another rank already reported the failure this one follows from."""

    def __init__(self, message: str, original: BaseException, quiet: bool = False):
        super().__init__(message)
        self.original, self.quiet = original, quiet


def debug_enabled() -> bool:
    return os.environ.get("DISTFL_DEBUG", "") not in ("", "0")


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


@contextmanager
def writing(path):
    """Name `path` in an OSError that lacks a file name (a failed write() or flush() has none)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def free_space(path) -> str:
    """'the filesystem at MOUNT has FREE free of SIZE' for the filesystem holding `path`."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    mount = where
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        st = os.statvfs(where)
    except OSError:
        return f"the filesystem at {mount}"
    return f"the filesystem at {mount} has {_bytes(st.f_bavail * st.f_frsize)} free of {_bytes(st.f_blocks * st.f_frsize)}"


def latest_checkpoint(run_dir: Path) -> str | None:
    try:
        return (Path(run_dir) / "checkpoints" / "latest").read_text().strip() or None
    except OSError:
        return None


def disk_full_message(exc: OSError, run_dir: Path) -> str:
    where = f"disk full writing {exc.filename or run_dir} ({free_space(exc.filename or run_dir)})"
    if not (Path(run_dir) / "config.yaml").is_file():
        return f"{where}; the run had not started. Free some space, then run the same command again"
    latest = latest_checkpoint(run_dir)
    kept = (f"the last good checkpoint, {Path(run_dir) / 'checkpoints' / latest}, is kept" if latest else
            "no checkpoint had been written yet (the resume starts the run over from its config)")
    return f"{where}; {kept}. Free some space, then continue with `distfl train --resume {run_dir}`"


def _raised_in_collective(exc: BaseException) -> bool:
    from . import dist

    return any(frame.f_code.co_filename == dist.__file__ for frame, _ in traceback.walk_tb(exc.__traceback__))


def _store():
    try:
        import torch.distributed.distributed_c10d as c10d

        return c10d._get_default_store() if c10d.is_initialized() else None
    except Exception:  # no process group, or its store is gone with the launcher
        return None


def _peer_report(run_dir: Path, rank: int, since: float, in_collective: bool) -> str | None:
    """The line another rank of this run reported its failure with, if it did (its log file is
    looked for only when this rank's error came from a collective, i.e. followed from a peer's)."""
    store = _store()
    try:
        if store is not None and store.check([STORE_KEY]):
            return store.get(STORE_KEY).decode()
    except Exception:
        pass
    for log in Path(run_dir).glob("error*.log") if in_collective else ():
        try:
            if log.name != _log_name(rank) and log.stat().st_mtime >= since:
                return log.read_text().splitlines()[0]
        except (OSError, IndexError):
            continue
    return None


# Modules whose frames are not a user's code: distfl's, the libraries it calls, Python's own.
_NOT_USER = ("distfl", "torch", "numpy", "importlib", "runpy", "contextlib", "functools")


def user_code(exc: BaseException) -> str:
    """' (in FUNCTION of FILE:LINE)' when the error rose from code outside distfl, a plugin method or
    model: the function distfl (or torch) called there, the hook, and the line in the user's file
    that raised. '' when no frame of the traceback is a user's."""
    frames = [(frame.f_code, frame.f_globals.get("__name__", ""), line)
              for frame, line in traceback.walk_tb(exc.__traceback__)]
    user = [(code, line) for code, module, line in frames
            if module.split(".")[0] not in _NOT_USER and module.split(".")[0] not in sys.stdlib_module_names
            and module != "__main__"]
    if not user:
        return ""
    hook, (code, line) = user[0][0].co_name, user[-1]
    return f" (in {hook} of {code.co_filename}:{line})" if code.co_name == hook else \
        f" (in {hook}, at {code.co_filename}:{line} in {code.co_name})"


def _log_name(rank: int) -> str:
    return "error.log" if rank == 0 else f"error.rank{rank}.log"


def _save_traceback(exc: BaseException, line: str, run_dir: Path | None, rank: int) -> Path | None:
    """RUN_DIR/error.log (error.rankN.log), or a file in the temporary directory before the run
    directory exists; None if neither can be written (a full disk)."""
    import tempfile

    text = line + "\n\n" + "".join(traceback.format_exception(exc))
    places = [Path(run_dir) / _log_name(rank)] if run_dir is not None else []
    for path in [*places, Path(tempfile.gettempdir()) / f"distfl-error-{os.getpid()}.log"]:
        if not path.parent.is_dir():
            continue
        try:
            path.write_text(text)
            return path
        except OSError:
            path.unlink(missing_ok=True)
    return None


class Failure:
    """An unexpected error of this rank's run, described once: `line` is what the user reads (also
    the summary's `error`); the traceback is saved; the other ranks are told through the store."""

    def __init__(self, exc: BaseException, where: str, run_dir: Path | None, rank: int, world_size: int,
                 since: float):
        """`run_dir`: where the traceback goes (None: a file in the temporary directory)."""
        self.exc = exc
        peer = None
        if world_size > 1:
            peer = _peer_report(run_dir, rank, since, _raised_in_collective(exc))
        self.quiet = peer is not None
        if rank == 0 and run_dir is not None and Path(run_dir).is_dir():
            remove_leftovers(run_dir)  # whichever rank failed: a checkpoint half-assembled is never resumed
        if peer is not None:
            self.line = peer
            return
        if is_disk_full(exc) and run_dir is not None:
            self.line = disk_full_message(exc, run_dir)
        else:
            what = f"{type(exc).__name__}: {exc}".strip().splitlines()[0] if str(exc) else type(exc).__name__
            who = f"rank {rank}, " if world_size > 1 else ""
            self.line = f"{who}{where}: {what}{user_code(exc)}"
        log = _save_traceback(exc, self.line, run_dir, rank)
        self.line += (f" (full traceback: {log})" if log else
                      " (the traceback could not be saved in the run directory: rerun with --debug to see it)")
        store = _store()
        if store is not None and world_size > 1:
            try:
                store.set(STORE_KEY, self.line)
            except Exception:
                pass

    def error(self) -> RunFailed:
        return RunFailed(self.line, self.exc, self.quiet)


def remove_leftovers(run_dir: Path) -> None:
    """Rank 0, holding the run's lock: a checkpoint being assembled (`.NAME.partial`) and temporary
    files (`.NAME.tmpPID`) that a failed write or a kill left behind."""
    import shutil

    run_dir = Path(run_dir)
    for partial in (run_dir / "checkpoints").glob(".*.partial"):
        shutil.rmtree(partial, ignore_errors=True)
    for folder in (run_dir, run_dir / "checkpoints", run_dir / "client_state"):
        for tmp in folder.glob(".*.tmp[0-9]*"):
            tmp.unlink(missing_ok=True)


def check_output_dir(run_dir: Path) -> None:
    """Refuse, before any work, an output.dir that cannot hold a run: a file, under a file, a name
    too long for its filesystem, or on a read-only filesystem or directory."""
    path = Path(os.path.abspath(run_dir))
    existing = path
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing == path and not path.is_dir():
        raise ConfigError(f"output.dir {run_dir} is a file, not a directory; pick another output.dir")
    if not existing.is_dir():
        raise ConfigError(f"output.dir {run_dir} is under {existing}, which is a file, not a directory; "
                          "pick another output.dir")
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):  # a filesystem that does not say: its own error comes when writing
        name_max, path_max = 1 << 30, 1 << 30
    too_long = [part for part in path.relative_to(existing).parts if len(part.encode()) > name_max]
    if too_long or len(str(path).encode()) + len("/checkpoints/.round_000000.partial/state.pt") >= path_max:
        raise ConfigError(f"output.dir {run_dir} is too long for its filesystem (names at most {name_max} bytes, "
                          f"paths under {path_max} bytes with the files a run writes); pick a shorter output.dir")
    for folder in (existing, path / "checkpoints", path / "client_state"):
        if folder.is_dir() and (not os.access(folder, os.W_OK | os.X_OK) or os.statvfs(folder).f_flag & os.ST_RDONLY):
            raise ConfigError(f"output.dir {run_dir}: {folder} is read-only; make it writable or pick another "
                              "output.dir")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long
        return False


@contextmanager
def run_dir_errors(run_dir: Path):
    """An OSError while creating or locking the run directory, as one line naming output.dir."""
    try:
        yield
    except OSError as exc:
        if is_disk_full(exc) and run_dir is not None:
            raise
        raise ConfigError(f"output.dir {run_dir}: cannot write {exc.filename or run_dir}: {exc.strerror or exc}") \
            from None



def attempt(action) -> Exception | None:
    """Run `action`; return the exception it raised instead of raising it (cleanup on a failing run)."""
    try:
        action()
    except Exception as exc:
        return exc
    return None
