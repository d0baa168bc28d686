"""runtime.cuda_graphs on the CPU: everything around a CUDA graph (a graph per batch shape, the copies into
its input tensors, its outputs overwritten by the next replay, the fallback to eager steps said once),
exercised with a stand-in that records a step and replays it on the CPU as a graph would. The real
graphs (the same bits as eager on a GPU) are checked in tests/integration/test_cuda.py."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from conftest import build_trainer, write_config
from distfl.errors import ConfigError
from distfl.federation import graphs
from distfl.federation.pack import PackBatches, client_batches
from test_packs import PACKABLE, _trained


class ReplayOnCpu:
    """A CUDA graph's contract on the CPU: capture records `fn` and returns its outputs; replay runs it
    again on whatever its input tensors hold now and writes the results into those same outputs."""

    def __init__(self):
        self.captured = self.replayed = self.warm_ups = 0

    def warm_up(self, fn, times: int = 2) -> None:
        self.warm_ups += times
        for _ in range(times):
            fn()

    def capture(self, fn):
        self.captured += 1
        outputs = fn()

        def replay():
            self.replayed += 1
            for out, new in zip(outputs, fn()):
                out.copy_(new)
        return replay, outputs


class CaptureRefused(ReplayOnCpu):
    def capture(self, fn):
        raise RuntimeError("operation not permitted when stream is capturing")


@pytest.fixture
def stand_in(monkeypatch):
    backend = ReplayOnCpu()
    monkeypatch.setattr(graphs, "backend_for", lambda device: backend)
    return backend


# Clients of unequal sizes (Dirichlet), batch 16: packs meet several batch shapes and row groups.
GRAPHED = ["fedavg", "fedprox", "scaffold_weights", "feddyn", "fedadc", "gma", "sphere_head_mse"]


@pytest.mark.parametrize("name", GRAPHED)
def test_graphed_packs_give_the_bits_of_eager_packs(tmp_path, stand_in, name):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 3, "clients_per_round": 6, "lr": 0.1,
                                                       "batch_size": 16})
    eager, _ = _trained(config, tmp_path, "eager", "runtime.pack_size=4", "runtime.cuda_graphs=off",
                        *PACKABLE[name], rounds=3)
    assert stand_in.captured == 0
    graphed, packs = _trained(config, tmp_path, "graphed", "runtime.pack_size=4", "runtime.cuda_graphs=on",
                              *PACKABLE[name], rounds=3)
    assert packs == [4, 2] * 3
    # Several shapes (4 and 2 rows, full and partial batches), each captured once and replayed many times.
    assert 2 <= stand_in.captured <= graphs.MAX_GRAPHS and stand_in.replayed > 3 * stand_in.captured
    assert graphed.pack_step.graphed.failed is None
    assert torch.equal(graphed.global_params, eager.global_params)
    assert torch.equal(graphed.global_buffers, eager.global_buffers)
    for key, value in eager.algorithm.server_state().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(graphed.algorithm.server_state()[key], value), key


def test_batchnorm_model_graphed_equals_eager(tmp_path, stand_in):
    """ResNet-20's BatchNorm statistics come out of the graph as outputs and its counters stay outside."""
    config = write_config(tmp_path / "c.yaml", model={"name": "resnet20"}, data={"synthetic_image_size": 16},
                          train={"rounds": 2, "clients_per_round": 4, "lr": 0.05, "batch_size": 16})
    eager, _ = _trained(config, tmp_path, "eager", "runtime.pack_size=4", "runtime.cuda_graphs=off")
    graphed, _ = _trained(config, tmp_path, "graphed", "runtime.pack_size=4", "runtime.cuda_graphs=on")
    assert stand_in.captured >= 1
    assert torch.equal(graphed.global_params, eager.global_params)
    assert torch.equal(graphed.global_buffers, eager.global_buffers)
    assert (graphed.global_buffers != 0).any()


def test_a_refused_capture_is_said_once_and_the_run_goes_on_eagerly(tmp_path, monkeypatch):
    backend = CaptureRefused()
    monkeypatch.setattr(graphs, "backend_for", lambda device: backend)
    config = write_config(tmp_path / "c.yaml", train={"rounds": 3, "clients_per_round": 6, "lr": 0.1,
                                                       "batch_size": 16})
    eager, _ = _trained(config, tmp_path, "eager", "runtime.pack_size=4", "runtime.cuda_graphs=off", rounds=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        refused, _ = _trained(config, tmp_path, "refused", "runtime.pack_size=4", "runtime.cuda_graphs=on", rounds=3)
    said = [str(w.message) for w in caught if "cuda_graphs" in str(w.message)]
    assert len(said) == 1 and "operation not permitted when stream is capturing" in said[0]
    assert refused.pack_step.graphed.failed and not refused.pack_step.graphed.graphs
    assert torch.equal(refused.global_params, eager.global_params)
    from distfl.federation.summary import graphs_status
    assert graphs_status(refused.pack_step).startswith("failed: RuntimeError")
    assert graphs_status(eager.pack_step) == "off"


def test_summary_names_the_graphs_of_a_run(tmp_path, stand_in):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 2, "clients_per_round": 4, "batch_size": 16})
    out = tmp_path / "run"
    # In-process, so the stand-in backend applies (a subprocess would see the CPU: no graphs).
    from distfl import api
    result = api.train(str(config), runtime__pack_size=4, runtime__cuda_graphs="on", output__dir=str(out))
    assert result.summary["cuda_graphs"].startswith("on (")
    assert json.loads((out / "summary.json").read_text())["cuda_graphs"] == result.summary["cuda_graphs"]


@pytest.mark.parametrize("overrides,expected", [
    (["runtime.cuda_graphs=on", "runtime.pack_size=4"], "runtime.cuda_graphs=on needs a GPU"),
])
def test_graphs_on_a_cpu_are_refused(tmp_path, overrides, expected):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 1, "clients_per_round": 4})
    with pytest.raises(ConfigError, match=expected):
        build_trainer(config, tmp_path / "r", *overrides)


def test_graphs_need_packs(stand_in):
    with pytest.raises(ConfigError, match="runtime.pack_size=1"):
        graphs.resolve_cuda_graphs("on", torch.device("cpu"), 1)
    assert graphs.resolve_cuda_graphs("auto", torch.device("cpu"), 1) is None
    assert graphs.resolve_cuda_graphs("auto", torch.device("cpu"), 4) is stand_in
    assert graphs.resolve_cuda_graphs("off", torch.device("cpu"), 4) is None


def test_auto_uses_graphs_on_cuda_only():
    assert graphs.resolve_cuda_graphs("auto", torch.device("cpu"), 50) is None
    assert isinstance(graphs.backend_for(torch.device("cuda", 0)), graphs.CudaGraphBackend)


def test_more_shapes_than_graphs_run_eagerly(stand_in):
    calls = []

    def step(x):
        calls.append(x.shape)
        return (x * 2,)
    graphed = graphs.GraphedStep(step, stand_in)
    for n in range(1, graphs.MAX_GRAPHS + 4):
        x = torch.arange(float(n))
        assert torch.equal(graphed(x)[0], x * 2)
        assert torch.equal(graphed(x + 1)[0], (x + 1) * 2)  # a replay reads the new input
    assert stand_in.captured == graphs.MAX_GRAPHS and len(graphed.graphs) == graphs.MAX_GRAPHS


@pytest.mark.parametrize("augment", [False, True])
def test_a_packs_gathered_batches_are_each_clients_own(augment):
    """One gather for a pack's rows at a step gives each client exactly the batch it draws alone."""
    from types import SimpleNamespace
    from distfl.federation.local import ClientRun
    gen = torch.Generator().manual_seed(0)
    data = SimpleNamespace(train_x=torch.randn(200, 3, 4, 4, generator=gen), train_y=torch.arange(200),
                           augment=(lambda x: x + torch.randn_like(x)) if augment else None)
    sizes = [23, 40, 17, 40]  # unequal: groups change from step to step
    starts = [0, 23, 63, 80]
    indices = [torch.arange(s, s + n) for s, n in zip(starts, sizes)]
    runs = [ClientRun(client_id=k, round_idx=3, num_samples=n, weight=1.0, steps=0,
                      global_params=torch.zeros(1)) for k, n in enumerate(sizes)]
    cfg = SimpleNamespace(batch_size=8, local_epochs=2, local_steps=0)
    pack = PackBatches(data, indices, runs, cfg, 7, torch.device("cpu"), False)
    alone = [client_batches(data, idx, run, cfg, 7, torch.device("cpu")) for idx, run in zip(indices, runs)]
    seen = 0
    for s in range(len(pack)):
        for rows in pack.groups(s):
            x, y = pack.gather(s, rows)
            assert torch.equal(x, torch.stack([alone[k][s][0] for k in rows]))
            assert torch.equal(y, torch.stack([alone[k][s][1] for k in rows]))
            seen += len(rows)
    assert seen == sum(len(a) for a in alone) and len(pack) == max(len(a) for a in alone)


def test_tf32_is_what_a_run_asks_for():
    from distfl.dist import cuda_float32_numerics
    try:
        cuda_float32_numerics(tf32=True)
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        cuda_float32_numerics()
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
