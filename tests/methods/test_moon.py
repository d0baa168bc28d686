"""MOON (docs/algorithms/moon.md): the identities the paper implies, its loss recomputed independently,
exactness across ranks and resume, and what it refuses."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn.utils import vector_to_parameters

from conftest import build_trainer, metrics, one_two_resumed, run_cli, train_ok, write_config
from distfl.algorithms.moon import contrastive_loss

# Six clients, all sampled every round: from round 2 on every client has a previous local model.
MOON = {"partition": {"num_clients": 6}, "train": {"rounds": 6, "clients_per_round": 6},
        "model": {"name": "mlp", "projection_dim": 16}}


@pytest.fixture
def moon_config(tmp_path):
    return write_config(tmp_path / "moon.yaml", **MOON)


def test_mu_zero_trains_the_model_fedavg_trains(tmp_path, moon_config):
    """With mu = 0 the contrastive term adds exact zeros: the same model as FedAvg on the same network,
    bit for bit; with the paper's mu the term acts (so the path was taken)."""
    fedavg = train_ok(moon_config, f"output.dir={tmp_path / 'fedavg'}")
    mu0 = train_ok(moon_config, f"output.dir={tmp_path / 'mu0'}", "algorithm.name=moon", "algorithm.moon_mu=0")
    mu1 = train_ok(moon_config, f"output.dir={tmp_path / 'mu1'}", "algorithm.name=moon")
    assert mu0["model_sha256"] == fedavg["model_sha256"]
    assert [r["train_loss"] for r in metrics(tmp_path / "mu0")] == [r["train_loss"] for r in metrics(tmp_path / "fedavg")]
    assert mu1["model_sha256"] != fedavg["model_sha256"]


def _independent_loss(cfg, input_shape, num_classes, local, global_, previous, x, y, mu, tau) -> torch.Tensor:
    """Eq. 3 in float64 from three freshly built networks: cross-entropy + mu * l_con of Eq. 2, written out."""
    from distfl.models import build_model

    def network(vector):
        model = build_model(cfg.model, input_shape, num_classes).double().eval()
        vector_to_parameters(vector.double(), model.parameters())
        return model

    def representation(vector):
        return network(vector).features(x.double())  # the projection head's output

    z, z_glob, z_prev = representation(local), representation(global_), representation(previous)
    logits = network(local)(x.double())
    supervised = (torch.logsumexp(logits, 1) - logits[torch.arange(len(y)), y]).mean()

    def cos(a, b):
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))

    positive, negative = torch.exp(cos(z, z_glob) / tau), torch.exp(cos(z, z_prev) / tau)
    contrastive = -torch.log(positive / (positive + negative)).mean()
    return supervised + mu * contrastive, contrastive


def test_loss_equals_the_paper_recomputed_independently(tmp_path, moon_config):
    trainer = build_trainer(moon_config, tmp_path / "run", "algorithm.name=moon", "algorithm.moon_mu=2.5",
                            "algorithm.moon_tau=0.3")
    alg, worker = trainer.algorithm, trainer.worker
    trained = {}
    inner = alg.client_statistics

    def recording(run, w, stats):
        trained[run.client_id] = w.params.clone()
        inner(run, w, stats)

    alg.client_statistics = recording
    trainer.run_round(1)
    client = 4
    run = trainer.client_run(client, 2, list(range(6)))
    assert torch.equal(run.state["previous_params"], trained[client])  # the state holds its last local model
    worker.load(trainer.global_params, trainer.global_buffers)
    alg.begin_client(run, worker)
    # The local model some steps into training: another point than either frozen model.
    worker.params.add_(torch.randn(worker.num_params, generator=torch.Generator().manual_seed(1)) * 0.05)
    idx = trainer.client_indices[client][:16]
    x, y = trainer.data.train_x[idx], trainer.data.train_y[idx]
    got = alg.local_loss(worker.module, x, y, run)
    with torch.no_grad():
        want, contrastive = _independent_loss(trainer.cfg, trainer.data.input_shape, trainer.data.num_classes,
                                              worker.params, trainer.global_params, trained[client], x, y, 2.5, 0.3)
    assert abs(float(contrastive) - float(torch.log(torch.tensor(2.0)))) > 1e-3  # not the degenerate log 2
    assert float(got.detach()) == pytest.approx(float(want), rel=1e-5)
    # A client never trained has no previous model: its loss is the supervised one alone, exactly.
    assert alg.init_client_state() == {}
    first = dataclasses.replace(run, state={})
    model = worker.module
    assert torch.equal(alg.local_loss(model, x, y, first).detach(), model.loss(model(x), y).detach())


def test_contrastive_loss_small_case_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    z_prev = torch.tensor([[-1.0, 0.0], [3.0, 0.0]])
    tau = 0.5
    # sample 1: cos(z, z_glob) = 1/sqrt(2), cos(z, z_prev) = -1; sample 2: 1 and 0.
    a = torch.tensor([2 ** -0.5, 1.0], dtype=torch.float64) / tau
    b = torch.tensor([-1.0, 0.0], dtype=torch.float64) / tau
    by_hand = float((-torch.log(torch.exp(a) / (torch.exp(a) + torch.exp(b)))).mean())
    assert float(contrastive_loss(z, z_glob, z_prev, tau)) == pytest.approx(by_hand, rel=1e-6)


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, moon_config):
    """Same model on 1 rank (state in memory), on 2 ranks with the state on disk and balanced placement,
    and stopped after round 4 then resumed on 2 ranks (memory, sticky): the previous local models are
    checkpointed and restored."""
    one_two_resumed(moon_config, tmp_path, "algorithm.name=moon",
                    two=("runtime.client_state=disk", "runtime.placement=balanced"))


def test_composes_with_sphere_head_gma_and_server_momentum(tmp_path, moon_config):
    """The contrastive term on SphereFed's normalised features (cosine: unchanged by the normalisation),
    GMA's mask and a server momentum: it trains, and the term still acts (mu = 0 is another model)."""
    extra = ["model.head=sphere", "aggregation.mask=gma", "server.momentum=0.9", "server.lr=0.5"]
    on = train_ok(moon_config, f"output.dir={tmp_path / 'on'}", "algorithm.name=moon", *extra)
    off = train_ok(moon_config, f"output.dir={tmp_path / 'off'}", "algorithm.name=moon", "algorithm.moon_mu=0", *extra)
    assert on["status"] == "completed" and on["model_sha256"] != off["model_sha256"]


@pytest.mark.parametrize("override,message", [
    ("model.projection_dim=0", "model.projection_dim=256"),
    ("runtime.pack_size=2", "runtime.pack_size=1"),
])
def test_refusals_come_before_any_work(tmp_path, moon_config, override, message):
    proc = run_cli(["train", str(moon_config), f"output.dir={tmp_path / 'r'}", "algorithm.name=moon",
                    "runtime.client_state=disk", override])
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_projection_head_sits_between_features_and_head():
    from distfl.models import build_model
    from distfl.config.schema import ModelConfig

    model = build_model(ModelConfig(name="mlp", projection_dim=12), (1, 8, 8), 10)
    assert model.feature_dim == 12 and model.head.in_features == 12
    assert [n for n, _ in model.features.projection.named_children()] == ["fc1", "relu", "fc2"]
    assert model.features.projection.fc1.in_features == model.features.projection.fc1.out_features == 64
    x = torch.rand(3, 1, 8, 8)
    f = model.features
    hidden = f.relu2(f.fc2(f.relu1(f.fc1(f.flatten(x)))))
    assert torch.equal(model(x), model.head(f.projection.fc2(f.projection.fc1(hidden).relu())))
