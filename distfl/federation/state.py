"""Per-client persistent state (SCAFFOLD's c_i, FedDyn's gradient, ...), kept by the hosting rank.

memory: a dict on the hosting rank; placement must be sticky, so a client always returns to the rank
        that holds its state.
disk:   one file per client under RUN_DIR/client_state/, written atomically; any rank can host any
        client (the run directory must be on a filesystem all ranks share).
Checkpoints hold one file per client (`clients/<id>.pt`), so a run can resume on any number of ranks.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoint import atomic_torch_save, check_restorable, load_tensors
from ..faults import writing


class ClientStateStore:
    """`device`: where clients train (the run's device), the device `get` returns state on. `home`:
    where in-memory state lives between rounds; the run's device unless `place` moves it to the host."""

    def __init__(self, kind: str, run_dir: Path, device: torch.device, method: str = "?"):
        self.kind, self.method, self._checked = kind, method, False
        self.device = device
        self.home = device
        self.directory = Path(run_dir) / "client_state"
        self._memory: dict[int, dict] = {}

    def place(self, example: dict, clients_here: int, gpu_free: int | None = None,
              host_free: int | None = None, ranks_here: int | None = None) -> None:
        """Choose where in-memory state lives, before any work, from one client's state (`example`) and
        how many clients this rank may keep: the GPU while all of it takes at most a quarter of the free
        GPU memory, else the host while the state of all `ranks_here` ranks on this host (default: the
        launcher's count) takes at most half the available host memory (`available_host_memory`: the
        cgroup's limit counts); else refuse, naming the disk store."""
        if self.kind != "memory" or clients_here <= 0:
            return
        total = clients_here * sum(t.numel() * t.element_size() for t in example.values()
                                   if isinstance(t, torch.Tensor))
        if self.device.type == "cuda":
            gpu_free = torch.cuda.mem_get_info(self.device)[0] if gpu_free is None else gpu_free
            if total <= gpu_free // 4:
                self.home = self.device
                return
        host_free = available_host_memory() if host_free is None else host_free
        if ranks_here is None:
            from ..dist import local_world_size

            ranks_here = local_world_size()
        if host_free is not None and total * ranks_here > host_free // 2:
            from ..errors import ConfigError

            ranks = f" on each of the {ranks_here} ranks on this host" if ranks_here > 1 else " on this rank"
            raise ConfigError(f"per-client state would take {total * ranks_here / 2**30:.2f} GiB of host memory "
                              f"({total / 2**30:.2f} GiB for {clients_here} clients{ranks}), more than half the "
                              f"{host_free / 2**30:.2f} GiB of available memory; use runtime.client_state=disk "
                              "(one file per client under the run directory)")
        self.home = torch.device("cpu")

    def _to(self, state: dict, device: torch.device) -> dict:
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in state.items()}

    def get(self, client_id: int, init, device: torch.device | None = None) -> dict:
        """Client `client_id`'s state on `device` (default: the run's), a copy where it moves, created by
        `init()` the first time."""
        device = self.device if device is None else device
        if self.kind == "memory":
            if client_id not in self._memory:
                self._memory[client_id] = self._to(init(), self.home)
            return self._to(self._memory[client_id], device)  # a copy: a failed client must not alter it
        path = self._path(client_id)
        return load_tensors(path, device) if path.exists() else init()

    def peek(self, client_id: int) -> dict | None:
        """The client's state on the run's device, or None if it has none yet (never creates one)."""
        if self.kind == "memory":
            state = self._memory.get(client_id)
            return None if state is None else self._to(state, self.device)
        path = self._path(client_id)
        return load_tensors(path, self.device) if path.exists() else None

    def put(self, client_id: int, state: dict) -> None:
        if not self._checked:  # the first client's state: one a checkpoint could not restore stops the run now
            check_restorable(state, f"algorithm.name={self.method}: the client state")
            self._checked = True
        if self.kind == "memory":
            self._memory[client_id] = self._to(state, self.home)
        else:
            atomic_torch_save(state, self._path(client_id))

    def _path(self, client_id: int) -> Path:
        return self.directory / f"{client_id}.pt"

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
        # A copy each, never a hard link: a link would make one file of client_state/ and of every kept
        # checkpoint, so one damaged file would break them all (docs/checkpoints.md).
        paths = list(self.directory.glob("*.pt"))
        for path in paths:
            _copy(path, clients_dir / path.name)
        return len(paths)

    def restore(self, clients_dir: Path, hosted, is_main: bool) -> None:
        """Load state from a checkpoint. memory: the clients `hosted(id)` says live on this rank."""
        files = sorted(clients_dir.glob("*.pt")) if clients_dir.exists() else []
        if self.kind == "memory":
            self._memory = {}
            for path in files:
                client_id = int(path.stem)
                if hosted(client_id):
                    self._memory[client_id] = load_tensors(path, self.home)
        elif is_main:
            self.create()
            for path in self.directory.glob("*.pt"):
                path.unlink()
            for path in files:
                _copy(path, self.directory / path.name)


def available_host_memory(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process may still take: MemAvailable of /proc/meminfo, or less where a memory cgroup
    (v2 memory.max, v1 memory.limit_in_bytes; a container's or a Slurm job's limit) leaves less. None
    where neither is known."""
    found = []
    try:
        with open(proc / "meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except OSError:
        pass
    found += _cgroup_room(proc, cgroup_root)
    return min(found) if found else None


def _cgroup_room(proc: Path, root: Path) -> list[int]:
    """limit - (usage - reclaimable page cache) of each memory cgroup that limits this process."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    own = {}  # controller ("" for v2) -> this process's cgroup path
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") or [""]:
            own[name] = path.lstrip("/")
    places = [(root / own.get("", ""), "memory.max", "memory.current", "inactive_file"), (root, "memory.max",
              "memory.current", "inactive_file")]
    for base in {root / "memory" / own.get("memory", ""), root / "memory"}:
        places.append((base, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
    rooms = []
    for base, limit_file, usage_file, cache_key in places:
        try:
            limit = (base / limit_file).read_text().strip()
            usage = int((base / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:  # no limit
            continue
        cache = 0
        try:
            stat = dict(line.split() for line in (base / "memory.stat").read_text().splitlines() if line.count(" ") == 1)
            cache = int(stat.get(cache_key, 0))
        except (OSError, ValueError):
            pass
        rooms.append(max(int(limit) - max(usage - cache, 0), 0))
    return rooms


def _copy(src: Path, dst: Path) -> None:
    """A file of its own at `dst` (unlinked first: it may be a hard link an older distfl made)."""
    import shutil

    dst.unlink(missing_ok=True)
    with writing(dst):
        shutil.copyfile(src, dst)
