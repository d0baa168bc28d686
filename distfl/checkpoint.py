"""Atomic, verifiable checkpoints.

Layout:  RUN_DIR/checkpoints/round_000010/{state.pt, clients/<id>.pt, manifest.json}
         RUN_DIR/checkpoints/ffc_000011/...   (a phase after training: LABEL_STEP)
         RUN_DIR/checkpoints/latest        (the name of the newest committed checkpoint; resume scans them all)
Names are LABEL_STEP: the step counts training rounds, then goes on through the phases that follow
them (calibration, TCT's stages), so checkpoints order by step whatever their label.
A checkpoint is assembled in a temporary directory and renamed into place only when every rank has
written its part and every file and directory is fsynced. `manifest.json` lists every file (state.pt
and each client file) with its SHA-256 and the number of client files; loading refuses a checkpoint
with a file missing, unlisted or altered, naming the file. Resume takes the newest checkpoint that
passes (`newest_good`): one that a kill cut short is skipped with a message saying why.
Everything is read with `torch.load(weights_only=True)`: tensors, numbers, strings, lists and dicts.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import torch

from .errors import CheckpointError, PluginError
from .faults import writing

FORMAT_VERSION = 1
METRICS = "metrics.jsonl"


def fsync(path: Path) -> None:
    """Flush a file's or a directory's contents (a directory: its entries) to disk. DISTFL_FSYNC=0 skips it
    (docs/checkpoints.md): the files are still written and renamed in the same order."""
    if os.environ.get("DISTFL_FSYNC") == "0":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(data, path: Path) -> None:
    """Checkpoints, client state and run files are written here: a failed write (a full disk) raises OSError naming
    `path` and leaves no half-written file."""
    try:
        with writing(path):
            _write_file(data, path)
    except OSError:
        Path(path).unlink(missing_ok=True)
        raise


def _write_file(data, path: Path) -> None:
    with open(path, "wb") as f:
        f.write(data)


def save_tensors(obj, path: Path) -> None:
    """torch.save, serialised in memory first: torch's own file writer reports a full disk as a
    RuntimeError without the file's name; `write_bytes` reports it as OSError(ENOSPC) naming it."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_bytes(buffer.getbuffer(), path)


def atomic_write_text(text: str, path: Path) -> None:
    """Write, fsync, rename, fsync the directory: after a crash, the old text or the new, whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write_bytes(text.encode(), tmp)
        fsync(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        exc.filename = str(path)  # the file the user knows, not its temporary name
        raise
    fsync(path.parent)


def atomic_torch_save(obj, path: Path) -> None:
    """Write and rename, without fsync: client state files are made durable when a checkpoint that
    holds them is committed (`commit` fsyncs each), and are restored from that checkpoint on resume."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_tensors(obj, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        exc.filename = str(path)  # the file the user knows, not its temporary name
        raise


def check_restorable(obj, what: str) -> None:
    """Raise PluginError naming `what` and the key, unless `obj` reads back under
    torch.load(weights_only=True): a method's state that a checkpoint could not restore stops the run
    when it is first written, not at a resume that can then never succeed."""
    if _restorable(obj):
        return
    key, value = _culprit(obj, "")
    raise PluginError(f"{what}{key} is a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint "
                      "cannot restore (torch.load(weights_only=True) reads tensors, numbers, strings, None, and "
                      "lists, tuples and dicts of them): return it as one of those. Stopped before writing a "
                      "checkpoint that no resume could read")


def _restorable(obj) -> bool:
    buffer = io.BytesIO()
    try:
        torch.save(obj, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception:
        return False
    return True


def _culprit(obj, key: str) -> tuple[str, object]:
    """The innermost key (as `['a'][0]`) of a value that does not restore, and that value."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, value in items:
        if not _restorable(value):
            return _culprit(value, f"{key}[{k!r}]")
    return key, obj


def load_tensors(path: Path, device=None):
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None


def file_sha256(path) -> str:
    """SHA-256 of a file's bytes, read 1 MiB at a time (checkpoint manifests, data and partition files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_name(label: str, step: int) -> str:
    return f"{label}_{step:06d}"


def _step(path: Path) -> int:
    return int(path.name.rpartition("_")[2])


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint directories, oldest step first."""
    root = checkpoints_dir(run_dir)
    found = [p for p in root.glob("*_[0-9]*") if p.is_dir() and p.name.rpartition("_")[2].isdigit()]
    return sorted(found, key=_step)


def staging_dir(run_dir: Path, name: str) -> Path:
    return checkpoints_dir(run_dir) / f".{name}.partial"


def begin(run_dir: Path, name: str) -> Path:
    """Rank 0, before the barrier: a fresh, empty staging directory."""
    staging = staging_dir(run_dir, name)
    if staging.exists():
        shutil.rmtree(staging)
    (staging / "clients").mkdir(parents=True)
    return staging


def secret_text(value: str) -> str:
    """The text of a secret file in a checkpoint (privacy/secret.py's noise key): its value, then a check line
    (the first 16 hex digits of the value's SHA-256). The manifest names a secret file without its hash (a
    hash of a secret beside it is a way to test guesses of it); `verify` reads the check line instead."""
    return f"{value}\n{hashlib.sha256(value.encode()).hexdigest()[:16]}\n"


def secret_intact(path: Path) -> bool:
    """Whether a secret file holds `secret_text` of its first line."""
    try:
        text = Path(path).read_text()
    except (OSError, ValueError):
        return False
    return text == secret_text(text.split("\n")[0])


def commit(run_dir: Path, name: str, state: dict, keep: int, protect: tuple[str, ...] = (),
           clients: int = 0, secret: tuple[str, ...] = ()) -> Path:
    """Rank 0, after every rank wrote its clients (`clients` files in all): write state + manifest,
    fsync, rename, update `latest`. Of older checkpoints, `keep` are kept, plus those named in `protect`.
    `secret`: files the manifest lists by name only (each checked by its own check line: `secret_text`)."""
    staging = staging_dir(run_dir, name)
    found = len(list((staging / "clients").glob("*.pt")))
    if found != clients:
        raise CheckpointError(
            f"checkpoint {name}: the ranks wrote {clients} client state files but {staging / 'clients'} holds "
            f"{found}; with runtime.client_state=memory every rank writes its own clients there, so output.dir "
            "must be on a filesystem that all nodes share")
    method = state.get("config", {}).get("algorithm", {}).get("name", "?")
    check_restorable(state.get("server", {}), f"algorithm.name={method}: server_state()")
    save_tensors({"format_version": FORMAT_VERSION, **state}, staging / "state.pt")
    metrics = Path(run_dir) / METRICS
    if metrics.is_file():  # the history up to this checkpoint: a resume restores it (`restore_metrics`)
        with writing(staging / METRICS):
            shutil.copyfile(metrics, staging / METRICS)
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    secret = sorted(n for n in secret if (staging / n).is_file())
    manifest = {"name": name, "clients": clients,
                "files": {str(p.relative_to(staging)): file_sha256(p) for p in files
                          if str(p.relative_to(staging)) not in secret},
                **({"secret": secret} if secret else {})}
    write_bytes(json.dumps(manifest, indent=1).encode(), staging / "manifest.json")
    for path in [*files, staging / "manifest.json", staging / "clients", staging]:
        fsync(path)
    final = checkpoints_dir(run_dir) / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    fsync(final.parent)
    atomic_write_text(final.name + "\n", checkpoints_dir(run_dir) / "latest")
    for old in [p for p in complete_checkpoints(run_dir)[:-keep] if p.name not in protect]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def state_of(parts) -> dict:
    """The state a checkpoint holds (state.pt): the union of the state_dicts of the run's parts (its
    progress, the global model, the method's server, the privacy mechanism: federation/run_state.py).
    Their keys are disjoint and the same as every earlier release wrote, so older checkpoints resume."""
    state: dict = {}
    for part in parts:
        for key, value in part.state_dict().items():
            if key in state:
                raise ValueError(f"two parts of the run's state write the checkpoint key {key!r}")
            state[key] = value
    return state


def load_state(parts, state: dict) -> None:
    """Hand a loaded checkpoint's state back to the run's parts (`state_of`'s inverse)."""
    for part in parts:
        part.load_state_dict(state)


def load(path: Path, device) -> dict:
    """Verify the manifest, then load state.pt. Client files are verified here, loaded by the store."""
    path = Path(path)
    verify(path)
    state = load_tensors(path / "state.pt", device)
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {state.get('format_version')}, "
                              f"this distfl reads {FORMAT_VERSION}")
    return state


def verify(path: Path) -> None:
    """Raise CheckpointError naming the file unless the checkpoint holds exactly the files its
    manifest lists, each with its recorded SHA-256, and the number of client files it records."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} has no readable manifest.json ({exc})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    clients = manifest.get("clients", None) if isinstance(manifest, dict) else None  # absent in older manifests
    # secret files, by name only (older manifests hash the noise key under `files` instead)
    secret = manifest.get("secret", []) if isinstance(manifest, dict) else None
    if (not isinstance(files, dict) or "state.pt" not in files or not isinstance(clients, (int, type(None)))
            or not all(isinstance(d, str) and re.fullmatch("[0-9a-f]{64}", d) for d in files.values())
            or not isinstance(secret, list) or not all(isinstance(n, str) and n not in files for n in secret)):
        raise CheckpointError(f"checkpoint {path}: manifest.json is malformed (expected a mapping with "
                              "'files' {name: sha256} including state.pt, and 'clients', a count)")
    present = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} - {"manifest.json"}
    for name in secret:
        if name not in present:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is missing")
        if not secret_intact(path / name):
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} does not match its own check line "
                                  "(truncated or modified)")
    for name in sorted(set(files) | (present - set(secret))):
        if name not in present:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is missing")
        if name not in files:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is not listed in its manifest")
        if file_sha256(path / name) != files[name]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} does not match its recorded "
                                  "SHA-256 (truncated or modified)")
    listed = sum(1 for name in files if name.startswith("clients/"))
    if clients is not None and listed != clients:
        raise CheckpointError(f"checkpoint {path}: its manifest lists {listed} client files but records "
                              f"{clients} clients")


def newest_good(run_dir: Path, device) -> tuple[Path, dict, list[tuple[str, str]]]:
    """The newest checkpoint that verifies and loads, its state, and (name, why) of each newer one
    skipped: a kill can cut the newest short, and a requeued job must not die on it."""
    found = complete_checkpoints(run_dir)
    if not found and finished_run(run_dir):
        raise CheckpointError(f"{run_dir} has no checkpoint to resume from: {finished_run(run_dir)}")
    if not found:
        raise CheckpointError(f"{run_dir} has no checkpoint to resume from ({checkpoints_dir(run_dir)} holds no "
                              f"checkpoint such as {checkpoint_name('round', 1)}); start the run over with "
                              f"`distfl train {Path(run_dir) / 'config.yaml'} --overwrite`")
    skipped = []
    for path in reversed(found):
        try:
            return path, load(path, device), skipped
        except CheckpointError as exc:
            skipped.append((path.name, str(exc)))
    raise CheckpointError(f"no checkpoint of {run_dir} can be resumed from:" +
                          "".join(f"\n  {name}: {why}" for name, why in skipped))


def restore_metrics(run_dir: Path, path: Path) -> str | None:
    """Rank 0, on resume from checkpoint `path`: make RUN/metrics.jsonl begin with the rows the checkpoint
    holds (a copy of the file when it was written). Returns a line saying what was restored, or None when
    the file already agreed (rows after the checkpoint are the logger's to drop) or the checkpoint
    predates these copies."""
    saved, current = Path(path) / METRICS, Path(run_dir) / METRICS
    if not saved.is_file():
        if not current.exists() and _step(Path(path)) > 0:
            return (f"{current} is missing and checkpoint {Path(path).name} holds no copy of it (an older "
                    "distfl): the history restarts at the rounds after the checkpoint")
        return None
    rows = saved.read_bytes().splitlines(keepends=True)
    try:
        have = current.read_bytes().splitlines(keepends=True) if current.exists() else []
    except OSError:
        have = []
    if have[:len(rows)] == rows:
        later = next((i for i, line in enumerate(have[len(rows):], len(rows) + 1) if line.strip() and not _json_line(line)), None)
        if later is None or later == len(have):  # rows after the checkpoint (a torn last one) are the logger's
            return None
        why = f"has a damaged row after the checkpoint (line {later})"
    elif not current.exists():
        why = "was missing"
    else:
        why = f"differed from it at line {next(i for i, (a, b) in enumerate(zip([*have, b''], rows), 1) if a != b)}"
    atomic_write_text(b"".join(rows).decode(), current)
    return f"{current} {why}: its {len(rows)} rows up to checkpoint {Path(path).name} are restored from the checkpoint's copy"


def _json_line(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def finished_run(run_dir: Path) -> str | None:
    """For a run that ended (completed or diverged; summary.json says so) and has no checkpoint left:
    what it finished with and where its results are, and why --overwrite is not the way on. Else None."""
    try:
        done = json.loads((Path(run_dir) / "summary.json").read_text())
        status = done["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if status not in ("completed", "diverged") or complete_checkpoints(run_dir):
        return None
    acc = done.get("final_test_acc")
    result = f", final test accuracy {100 * acc:.2f}%" if isinstance(acc, (int, float)) else ""
    return (f"it finished ({status} after {done.get('rounds', '?')} rounds{result}) and its checkpoints were deleted "
            f"since; its results are in {Path(run_dir) / 'summary.json'} and {Path(run_dir) / 'metrics.jsonl'}. It "
            "cannot be continued; to train it again, pick another output.dir (--overwrite would delete those results)")


def set_aside(run_dir: Path, names: list[str], current: str) -> None:
    """Rank 0: move bad checkpoints out of the way (kept as `.NAME.bad` for inspection), so that neither
    pruning nor a later resume counts them, and point `latest` at the checkpoint resumed from."""
    root = checkpoints_dir(run_dir)
    for name in names:
        bad = root / f".{name}.bad"
        if bad.exists():
            shutil.rmtree(bad)
        os.replace(root / name, bad)
    atomic_write_text(current + "\n", root / "latest")


def lock_run_dir(run_dir: Path):
    """Rank 0: an exclusive lock on RUN_DIR/.lock, held while the returned file stays open. The kernel
    releases it when the process dies, so a killed run never blocks the next one. The file names the
    holder: its pid and host, and under torchrun its launcher's pid. A holder whose launcher is gone
    (a torchrun killed while its ranks train) stops within launcher.GRACE_S: a new run waits for it,
    saying so, instead of being refused."""
    from . import launcher

    path = Path(run_dir) / ".lock"
    try:
        handle = open(path, "a+")
    except OSError as exc:
        raise CheckpointError(f"cannot lock {run_dir}: {path} cannot be opened as a file ({exc.strerror}); "
                              f"it holds only a process id: remove it (it is remade) or pick another output.dir") \
            from None
    waited = False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                # A filesystem without locks (e.g. Lustre mounted without -o flock): run, unlocked.
                print(f"warning: cannot lock {path} ({exc.strerror}); nothing stops a second run in {run_dir}",
                      file=sys.stderr, flush=True)
                return handle
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        orphan = _orphaned_holder(holder)
        if orphan is not None and not waited:
            waited, deadline = True, time.monotonic() + launcher.GRACE_S + 5
            print(f"{run_dir} is held by rank 0 (pid {orphan}) of an earlier launch whose launcher is gone; it "
                  f"stops within {launcher.GRACE_S:g}s: waiting for it", file=sys.stderr, flush=True)
        if orphan is None or time.monotonic() > deadline:
            handle.close()
            raise CheckpointError(f"{run_dir} is in use by another distfl run (pid {holder}, holding {path}); "
                                  "wait for it to finish, or pick another output.dir") from None
        time.sleep(launcher.POLL_S)
    handle.truncate(0)
    handle.write(f"{os.getpid()} on {socket.gethostname()}"
                 f"{f' (launcher {launcher.LAUNCHER})' if launcher.LAUNCHER is not None else ''}\n")
    handle.flush()
    return handle


def _orphaned_holder(holder: str) -> int | None:
    """The pid of a lock holder on this host that a torchrun launcher started and that has outlived it
    (its parent is no longer that launcher), else None."""
    match = re.fullmatch(r"(\d+) on (\S+) \(launcher (\d+)\)", holder)
    if match is None or match[2] != socket.gethostname():
        return None
    try:
        stat = Path(f"/proc/{match[1]}/stat").read_text()
    except OSError:
        return None
    parent = int(stat.rpartition(")")[2].split()[1])
    return int(match[1]) if parent != int(match[3]) else None


def to_cpu(obj):
    """Tensors in `obj` (a tensor or a dict of them, nested) moved to the CPU, for a checkpoint."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    return obj
