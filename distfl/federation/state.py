"""Per-client persistent state (SCAFFOLD's c_i, FedDyn's gradient, ...), kept by the hosting rank.

memory: a dict on the hosting rank; placement must be sticky, so a client always returns to the rank
        that holds its state.
disk:   one file per client under RUN_DIR/client_state/, written atomically; any rank can host any
        client (the run directory must be on a filesystem all ranks share).
Checkpoints hold one file per client (`clients/<id>.pt`), so a run can resume on any number of ranks.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..checkpoint import atomic_torch_save, load_tensors
from ..faults import writing


class ClientStateStore:
    def __init__(self, kind: str, run_dir: Path, device: torch.device):
        self.kind = kind
        self.device = device
        self.directory = Path(run_dir) / "client_state"
        self._memory: dict[int, dict] = {}

    def _path(self, client_id: int) -> Path:
        return self.directory / f"{client_id}.pt"

    def get(self, client_id: int, init) -> dict:
        if self.kind == "memory":
            if client_id not in self._memory:
                self._memory[client_id] = init()
            return dict(self._memory[client_id])  # a copy: a failed client must not alter it
        path = self._path(client_id)
        return load_tensors(path, self.device) if path.exists() else init()

    def peek(self, client_id: int) -> dict | None:
        """The client's state, or None if it has none yet (never creates one)."""
        if self.kind == "memory":
            return self._memory.get(client_id)
        path = self._path(client_id)
        return load_tensors(path, self.device) if path.exists() else None

    def put(self, client_id: int, state: dict) -> None:
        if self.kind == "memory":
            self._memory[client_id] = state
        else:
            atomic_torch_save(state, self._path(client_id))

    def create(self) -> None:
        """Rank 0, once the run directory is ready (and emptied by --overwrite): disk: its directory."""
        if self.kind == "disk":
            self.directory.mkdir(parents=True, exist_ok=True)

    def write_checkpoint(self, clients_dir: Path, is_main: bool) -> int:
        """Write this rank's clients into a checkpoint being assembled (every rank calls this); return
        how many files this rank wrote, which the checkpoint then must hold in total."""
        clients_dir.mkdir(parents=True, exist_ok=True)
        if self.kind == "memory":
            for client_id, state in self._memory.items():
                atomic_torch_save(state, clients_dir / f"{client_id}.pt")
            return len(self._memory)
        if not is_main:
            return 0
        # Files are replaced by rename, never rewritten, so a hard link is a stable snapshot.
        paths = list(self.directory.glob("*.pt"))
        for path in paths:
            _link_or_copy(path, clients_dir / path.name)
        return len(paths)

    def restore(self, clients_dir: Path, hosted, is_main: bool) -> None:
        """Load state from a checkpoint. memory: the clients `hosted(id)` says live on this rank."""
        files = sorted(clients_dir.glob("*.pt")) if clients_dir.exists() else []
        if self.kind == "memory":
            self._memory = {}
            for path in files:
                client_id = int(path.stem)
                if hosted(client_id):
                    self._memory[client_id] = load_tensors(path, self.device)
        elif is_main:
            self.create()
            for path in self.directory.glob("*.pt"):
                path.unlink()
            for path in files:
                _link_or_copy(path, self.directory / path.name)


def _link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        import shutil

        with writing(dst):
            shutil.copyfile(src, dst)
