"""Atomic, verifiable checkpoints.

Layout:  RUN_DIR/checkpoints/round_000010/{state.pt, clients/<id>.pt, manifest.json}
         RUN_DIR/checkpoints/ffc_000011/...   (a phase after training: LABEL_STEP)
         RUN_DIR/checkpoints/latest        (the name of the newest complete checkpoint)
Names are LABEL_STEP: the step counts training rounds, then goes on through the phases that follow
them (calibration, TCT's stages), so checkpoints order by step whatever their label.
A checkpoint is assembled in a temporary directory and renamed into place only when every rank has
written its part; `manifest.json` records the SHA-256 of each file and is checked on load, so a
truncated or altered checkpoint is refused with a message instead of resuming from garbage.
Everything is read with `torch.load(weights_only=True)`: tensors, numbers, strings, lists and dicts.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from .errors import CheckpointError

FORMAT_VERSION = 1


def atomic_write_text(text: str, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_torch_save(obj, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_tensors(path: Path, device=None):
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None


def _sha256(path: Path) -> str:
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


def commit(run_dir: Path, name: str, state: dict, keep: int, protect: tuple[str, ...] = ()) -> Path:
    """Rank 0, after every rank wrote its clients: write state + manifest, rename, update `latest`.
    Of older checkpoints, `keep` are kept, plus those named in `protect`."""
    staging = staging_dir(run_dir, name)
    torch.save({"format_version": FORMAT_VERSION, **state}, staging / "state.pt")
    files = sorted(p for p in staging.rglob("*.pt"))
    manifest = {"name": name, "files": {str(p.relative_to(staging)): _sha256(p) for p in files}}
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
    final = checkpoints_dir(run_dir) / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    atomic_write_text(final.name + "\n", checkpoints_dir(run_dir) / "latest")
    for old in [p for p in complete_checkpoints(run_dir)[:-keep] if p.name not in protect]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path:
    root = checkpoints_dir(run_dir)
    pointer = root / "latest"
    if not pointer.exists():
        raise CheckpointError(f"{run_dir} has no checkpoint ({pointer} is missing); nothing to resume")
    path = root / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist")
    return path


def load(path: Path, device) -> dict:
    """Verify the manifest, then load state.pt. Client files are verified here, loaded by the store."""
    path = Path(path)
    manifest_path = path / "manifest.json"
    others = ", ".join(p.name for p in complete_checkpoints(path.parent.parent) if p != path) or "none"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} has no readable manifest.json ({exc}); "
                              f"other checkpoints: {others}") from None
    for name, digest in manifest["files"].items():
        file = path / name
        if not file.exists() or _sha256(file) != digest:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is missing or does not match its "
                                  f"recorded SHA-256 (truncated or modified). Other checkpoints: {others}")
    state = load_tensors(path / "state.pt", device)
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {state.get('format_version')}, "
                              f"this distfl reads {FORMAT_VERSION}")
    return state
