"""The GPU path, checked on the CPU: backend choice for ranks sharing a GPU, cuBLAS's workspace set at
import, client state on the device it is asked for, TCT's stage 2 on one device, state placement
decided before any work, and no host-device sync per client or per packed step. (Real GPU runs:
test_cuda.py, skipped without one.)"""
from __future__ import annotations

import os
import subprocess
import sys
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import REPO, build_trainer, run_cli, summary, train_ok, write_config
from distfl import dist
from distfl.errors import ConfigError
from distfl.federation import local
from distfl.federation.state import ClientStateStore


@pytest.mark.parametrize("use_cuda,ranks,gpus,backend", [
    (False, 2, 0, "gloo"), (True, 2, 1, "gloo"), (True, 2, 2, "nccl"), (True, 1, 8, "nccl"), (True, 8, 4, "gloo")])
def test_nccl_only_when_every_rank_of_the_node_has_its_own_gpu(use_cuda, ranks, gpus, backend):
    assert dist.choose_backend(use_cuda, ranks, gpus) == backend


@pytest.mark.parametrize("env,expected", [
    ({}, 1), ({"LOCAL_WORLD_SIZE": "3"}, 3),
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2),3"}, 4),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2)"}, 1),  # a batch script, not a step: one process
    ({"LOCAL_WORLD_SIZE": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4"}, 2)])
def test_ranks_per_node_from_torchrun_or_srun(env, expected):
    assert dist.local_world_size(env) == expected


def test_two_ranks_on_a_one_gpu_machine_join_with_gloo_on_that_gpu(monkeypatch):
    """`make quickstart` on a one-GPU machine: 2 ranks, runtime.device=auto. NCCL would refuse the
    second rank on the same GPU at the first collective ("Duplicate GPU detected")."""
    joined = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: joined.setdefault("device", device))
    monkeypatch.setattr(dist.torch_dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist.torch_dist, "init_process_group", lambda backend, timeout: joined.setdefault("backend", backend))
    monkeypatch.setattr(dist.torch_dist, "set_timeout", lambda timeout: None)
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    try:
        ctx = dist.init("auto", 1)
    finally:
        torch.backends.cudnn.deterministic = False
    assert joined == {"device": torch.device("cuda", 0), "backend": "gloo"}
    assert ctx.device == torch.device("cuda", 0) and ctx.backend == "gloo"


def test_cublas_workspace_is_set_when_distfl_is_imported():
    """Deterministic cuBLAS reads CUBLAS_WORKSPACE_CONFIG at the process's first cuBLAS call, which may
    come before dist.init (a notebook, pytest, code embedding the trainer)."""
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    code = "import os, distfl; print(os.environ.get('CUBLAS_WORKSPACE_CONFIG'))"
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, cwd=REPO)
    assert proc.stdout.strip() == ":4096:8", proc.stderr
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(REPO),
                          "CUBLAS_WORKSPACE_CONFIG": ":16:8"}, capture_output=True, text=True, cwd=REPO)
    assert proc.stdout.strip() == ":16:8"  # a user's own setting wins


def test_disk_state_loads_onto_the_device_asked_for(tmp_path):
    store = ClientStateStore("disk", tmp_path, torch.device("cpu"))
    store.create()
    store.put(3, {"h": torch.ones(4)})
    assert store.get(3, dict)["h"].device == torch.device("cpu")
    assert store.get(3, dict, device=torch.device("meta"))["h"].device == torch.device("meta")


def test_memory_state_lives_at_home_and_comes_back_on_the_device_asked_for(tmp_path):
    store = ClientStateStore("memory", tmp_path, torch.device("meta"))
    store.home = torch.device("cpu")
    store.put(1, {"c": torch.arange(3.0)})
    assert store._memory[1]["c"].device == torch.device("cpu")
    assert store.get(1, dict)["c"].device == torch.device("meta")  # the run's device by default
    state = store.get(1, dict, device=torch.device("cpu"))
    state["c"] = state["c"] + 1  # a client that fails after changing its copy leaves the stored one
    assert torch.equal(store._memory[1]["c"], torch.arange(3.0))


def test_tct_stage2_keeps_its_state_beside_its_solvers(tmp_path, monkeypatch):
    """Stage 2 runs on the host where the features are. With the run's device elsewhere (here `meta`,
    standing in for a GPU), SCAFFOLD's per-client state saved to disk must come back on the host: on
    the run's device the solver would mix devices from round 2 on."""
    from distfl.federation import state

    init = state.ClientStateStore.__init__
    monkeypatch.setattr(state.ClientStateStore, "__init__",
                        lambda self, kind, run_dir, device, *rest: init(self, kind, run_dir, torch.device("meta"), *rest))
    config = write_config(tmp_path / "c.yaml", algorithm={"name": "tct"},
                          tct={"p": 200, "rounds": 3, "local_steps": 10, "lr": 1e-3, "solver": "scaffold"},
                          runtime={"client_state": "disk"}, checkpoint={"every": 2, "keep": 10})
    elsewhere = train_ok(config, f"output.dir={tmp_path / 'meta'}")
    monkeypatch.setattr(state.ClientStateStore, "__init__", init)
    plain = train_ok(config, f"output.dir={tmp_path / 'plain'}")
    assert elsewhere["phases"]["tct"]["psi_sha256"] == plain["phases"]["tct"]["psi_sha256"]


GIB = 2**30


@pytest.mark.parametrize("gpu_free,host_free,home", [
    (40 * GIB, 100 * GIB, "cuda"),  # 10 GiB of state: within a quarter of the free GPU memory
    (30 * GIB, 100 * GIB, "cpu"),   # more than a quarter: the host
    (30 * GIB, 15 * GIB, None)])    # more than half the host's: refused, naming the disk store
def test_memory_state_is_placed_by_its_size(tmp_path, gpu_free, host_free, home):
    store = ClientStateStore("memory", tmp_path, torch.device("cuda", 0))
    example = {"c": torch.empty(GIB // 4, dtype=torch.float32, device="meta")}  # 1 GiB a client
    if home is None:
        with pytest.raises(ConfigError, match="runtime.client_state=disk"):
            store.place(example, 10, gpu_free=gpu_free, host_free=host_free)
    else:
        store.place(example, 10, gpu_free=gpu_free, host_free=host_free)
        assert store.home.type == home


def test_state_too_large_for_memory_is_refused_before_any_work(tmp_path, monkeypatch):
    from distfl.federation import state

    monkeypatch.setattr(state, "available_host_memory", lambda: 1000)
    config = write_config(tmp_path / "c.yaml", algorithm={"name": "scaffold"})
    proc = run_cli(["train", str(config), f"output.dir={tmp_path / 'r'}"])
    assert proc.returncode == 2 and "runtime.client_state=disk" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_deterministic_mode_does_not_fill_new_memory_and_results_do_not_depend_on_it(tmp_path, monkeypatch):
    """torch's deterministic mode fills every new tensor with NaN, a pass over memory per allocation.
    distfl reads no uninitialised memory, so it turns the fill off: the same bits with it on."""
    dist.init("cpu", 1)
    assert torch.utils.deterministic.fill_uninitialized_memory is False
    config = write_config(tmp_path / "c.yaml", algorithm={"name": "scaffold"}, train={"momentum": 0.9})
    off = train_ok(config, f"output.dir={tmp_path / 'off'}")
    packed_off = train_ok(config, f"output.dir={tmp_path / 'poff'}", "algorithm.name=fedavg", "runtime.pack_size=3")
    init = dist.init

    def init_with_fill(*args, **kwargs):
        ctx = init(*args, **kwargs)
        torch.utils.deterministic.fill_uninitialized_memory = True
        return ctx

    monkeypatch.setattr(dist, "init", init_with_fill)
    try:
        on = train_ok(config, f"output.dir={tmp_path / 'on'}")
        packed_on = train_ok(config, f"output.dir={tmp_path / 'pon'}", "algorithm.name=fedavg", "runtime.pack_size=3")
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = False
    assert on["model_sha256"] == off["model_sha256"] and packed_on["model_sha256"] == packed_off["model_sha256"]


class DeviceReads(TorchDispatchMode):
    """Counts the operations that bring a value from the device to the host (.item(), float(), bool()
    of a tensor, boolean-mask indexing): each waits for the GPU's queue."""

    SYNCING = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
               torch.ops.aten.masked_select.default}

    def __init__(self):
        super().__init__()
        self.count = 0

    # Indexing with a boolean mask finds its True positions on the host (a nonzero inside the kernel, which
    # on the CPU the dispatcher does not show as its own op).
    INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SYNCING:
            self.count += 1
        elif func in self.INDEXING and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                           for i in args[1] if i is not None):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _reads_in_one_round(tmp_path, clients: int, **sections) -> int:
    config = write_config(tmp_path / f"c{clients}.yaml", **sections)
    trainer = build_trainer(config, tmp_path / f"r{clients}", f"train.clients_per_round={clients}")
    trainer.run_round(1)  # the first round builds what later rounds reuse
    # The device's path on the host: the loss summed as a tensor, as on a GPU (the host reads each loss).
    with DeviceReads() as reads, mock.patch.object(local, "loss_sum_on_host", lambda device: False):
        trainer.run_round(2)
    return reads.count


@pytest.mark.parametrize("sections", [
    {"algorithm": {"name": "scaffold"}},
    {"model": {"name": "resnet20"}, "data": {"synthetic_channels": 3}, "aggregation": {"fedbn": True}},
    {"runtime": {"pack_size": 4}, "train": {"momentum": 0.9}},
    {"algorithm": {"name": "fedper"}},
    {"algorithm": {"name": "scaffold", "scaffold_correction": "weights"}, "model": {"name": "resnet20"},
     "data": {"synthetic_channels": 3, "synthetic_train": 480}, "aggregation": {"fedbn": True}, "train": {"momentum": 0.9},
     "runtime": {"pack_size": 4, "client_state": "disk"}}],
    ids=["scaffold", "fedbn", "packs", "fedper", "scaffold_weights_fedbn_packs"])
def test_a_round_reads_from_the_device_a_fixed_number_of_times_whatever_its_clients(tmp_path, sections):
    """Range and finiteness checks, counters, FedBN's and FedPer's coordinates cost no sync per client, and a
    packed step indexes with device tensors: a round of 8 clients waits for the device as often as one
    of 4 (on a GPU each wait drains the queue)."""
    assert _reads_in_one_round(tmp_path, 4, **sections) == _reads_in_one_round(tmp_path, 8, **sections)


def test_joining_does_not_import_the_compiler_stack():
    """torch.use_deterministic_algorithms imports torch._inductor (and torch._dynamo): ~1.9 s of every
    rank's start. dist.init sets the same kernel switch without it, strict or warn-only as asked."""
    code = ("import sys, torch\nfrom distfl import dist\n"
            "dist.init('cpu', 1, deterministic=sys.argv[1] == 'strict')\n"
            "print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),"
            " 'torch._inductor' in sys.modules, 'torch._dynamo' in sys.modules)\n")
    for mode, warn_only in (("strict", "False"), ("warn", "True")):
        proc = subprocess.run([sys.executable, "-c", code, mode], env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, cwd=REPO)
        assert proc.stdout.split() == ["True", warn_only, "False", "False"], proc.stderr
