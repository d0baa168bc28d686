"""SCAFFOLD's two placements of the correction c - c_i (`algorithm.scaffold_correction`,
docs/algorithms/scaffold.md): each against an independent recomputation in plain torch (torch.optim.SGD
on an nn.Module), exactness across ranks and resume, and where the two placements agree."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from conftest import build_trainer, one_two_resumed, run_cli, write_config

# Three clients, all every round (NIID-Bench samples every party), a few local steps each (2 epochs
# of 2-4 batches), SGD with momentum and weight decay as NIID-Bench runs it.
SCAFFOLD = {"data": {"synthetic_train": 150, "synthetic_test": 60},
            "partition": {"scheme": "dirichlet", "num_clients": 3, "alpha": 1.0},
            "train": {"rounds": 2, "clients_per_round": 3, "lr": 0.05, "batch_size": 16, "local_epochs": 2,
                      "momentum": 0.9, "weight_decay": 0.01},
            "algorithm": {"name": "scaffold"}}


@pytest.fixture
def scaffold_config(tmp_path):
    return write_config(tmp_path / "scaffold.yaml", **SCAFFOLD)


def _independent_client_round(trainer, client: int, round_idx: int, x: torch.Tensor, c: torch.Tensor,
                              c_i: torch.Tensor, placement: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's round written out in plain torch: a fresh network holding the global model x,
    torch.optim.SGD (momentum, weight decay) on the cross-entropy of each batch, and c - c_i either
    added to the gradient before `optimizer.step()` (Algorithm 1) or, as NIID-Bench's
    `train_net_scaffold`, subtracted from the weights after it: w <- w - lr * (c - c_i). Then option
    II as NIID-Bench writes it: c_i+ = c_i - c + (x - y) / (cnt * lr), cnt the steps taken.
    Returns (y, c_i+). The batches are the client's own (the runtime's keyed draw)."""
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed
    from distfl.models import build_model

    cfg = trainer.cfg
    torch.manual_seed(0)  # the network's own initialisation is overwritten by x below
    net = build_model(cfg.model, trainer.data.input_shape, trainer.data.num_classes)
    vector_to_parameters(x.clone(), net.parameters())
    lr = cfg.train.lr
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=cfg.train.momentum,
                                weight_decay=cfg.train.weight_decay)
    shapes = [p.shape for p in net.parameters()]
    sizes = [p.numel() for p in net.parameters()]
    c_parts = [v.view(s) for v, s in zip(torch.split(c, sizes), shapes)]
    c_i_parts = [v.view(s) for v, s in zip(torch.split(c_i, sizes), shapes)]
    torch.manual_seed(client_seed(cfg.seed, round_idx, client))
    cnt = 0
    for xb, yb in local_batches(trainer.data, trainer.client_indices[client], cfg.train):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        if placement == "gradient":  # g + c - c_i
            for p, cg, cl in zip(net.parameters(), c_parts, c_i_parts):
                p.grad += cg
                p.grad -= cl
        optimizer.step()
        if placement == "weights":
            with torch.no_grad():
                for p, cg, cl in zip(net.parameters(), c_parts, c_i_parts):
                    p.copy_(p - lr * (cg - cl))
        cnt += 1
    y = parameters_to_vector(net.parameters()).detach()
    return y, c_i - c + (x - y) / (cnt * lr)


@pytest.mark.parametrize("placement", ["gradient", "weights"])
def test_each_placement_equals_its_recomputation_in_plain_torch(tmp_path, scaffold_config, placement):
    """Two rounds of three clients: in round 2, c and every c_i are non-zero and c - c_i differs per
    client. Every client's trained model and c_i+ equal the plain-torch loop bit for bit, from the
    same global model, c and c_i; the server's c is c + (1/N) sum_k (c_i+ - c_i) (to the fixed-point
    sum's rounding)."""
    trainer = build_trainer(scaffold_config, tmp_path / "run", f"algorithm.scaffold_correction={placement}")
    alg = trainer.algorithm
    recorded = {}
    inner = alg.client_statistics

    def recording(run, worker, stats):
        trained = worker.params.clone()
        inner(run, worker, stats)
        recorded[run.client_id] = (trained, run.state["c"].clone())

    alg.client_statistics = recording
    n = len(trainer.population)
    for t in (1, 2):
        x, c = trainer.global_params.clone(), alg.c.clone()
        c_old = {k: trainer.store.get(k, alg.init_client_state)["c"].clone() for k in range(n)}
        if t == 2:
            assert min(float((c - c_old[k]).abs().max()) for k in range(n)) > 1e-2  # the correction acts
        recorded.clear()
        trainer.run_round(t)
        assert sorted(recorded) == list(range(n))
        for k in range(n):
            want_y, want_c = _independent_client_round(trainer, k, t, x, c, c_old[k], placement)
            got_y, got_c = recorded[k]
            assert torch.equal(got_y, want_y), (placement, t, k, float((got_y - want_y).abs().max()))
            assert torch.equal(got_c, want_c), (placement, t, k, float((got_c - want_c).abs().max()))
            assert torch.equal(trainer.store.get(k, alg.init_client_state)["c"], want_c)
        server_c = c.double() + sum(recorded[k][1].double() - c_old[k].double() for k in range(n)) / n
        torch.testing.assert_close(alg.c.double(), server_c, rtol=0, atol=1e-6)


def test_the_placements_differ_under_momentum(tmp_path, scaffold_config):
    """With momentum 0.9 the gradient placement feeds c - c_i through the momentum buffer: from round 2
    on (c != c_i) the two readings are different models."""
    models = {}
    for placement in ("gradient", "weights"):
        trainer = build_trainer(scaffold_config, tmp_path / placement, f"algorithm.scaffold_correction={placement}")
        trainer.run_round(1)
        after_one = trainer.global_params.clone()
        trainer.run_round(2)
        models[placement] = (after_one, trainer.global_params.clone())
    # Round 1 has c = c_i = 0: both placements add exact zeros.
    assert torch.equal(models["gradient"][0], models["weights"][0])
    assert (models["gradient"][1] - models["weights"][1]).abs().max() > 1e-3


def test_without_momentum_and_weight_decay_the_placements_agree(tmp_path, scaffold_config):
    """Without momentum and weight decay both are y <- y - lr (g + c - c_i): the same model up to float
    rounding (one placement rounds g + c - c_i before the step, the other rounds the two moves
    separately, so the bits differ and a tolerance is needed). Four rounds, so c - c_i acts in three."""
    plain = ["train.momentum=0", "train.weight_decay=0", "train.rounds=4"]
    params = {}
    for placement in ("gradient", "weights"):
        trainer = build_trainer(scaffold_config, tmp_path / placement, f"algorithm.scaffold_correction={placement}",
                                *plain)
        start = trainer.global_params.clone()
        for t in range(1, 5):
            trainer.run_round(t)
        params[placement] = (trainer.global_params.clone(), trainer.algorithm.c.clone())
    moved = float((params["gradient"][0] - start).abs().max())
    assert moved > 0.05
    torch.testing.assert_close(params["weights"][0], params["gradient"][0], rtol=0, atol=1e-5 * moved)
    torch.testing.assert_close(params["weights"][1], params["gradient"][1], rtol=0, atol=1e-6)


def test_weights_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    """NIID-Bench's placement with momentum and weight decay: the same model on 1 rank (state in memory),
    on 2 ranks (state on disk, balanced placement), and stopped after round 4, resumed on 2 ranks."""
    args = ["algorithm.name=scaffold", "algorithm.scaffold_correction=weights", "train.momentum=0.9",
            "train.weight_decay=0.001"]
    one_two_resumed(small_config, tmp_path, *args, two=("runtime.client_state=disk", "runtime.placement=balanced"))
    saved = yaml.safe_load((tmp_path / "stopped" / "config.yaml").read_text())
    assert saved["algorithm"]["options"]["correction"] == "weights"  # what the resumed run read


def test_an_unknown_placement_is_refused_before_any_work(tmp_path, small_config):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'r'}", "algorithm.name=scaffold",
                    "algorithm.scaffold_correction=weight"])
    assert proc.returncode == 2 and "algorithm.scaffold_correction" in proc.stderr and "weights" in proc.stderr
    assert not (tmp_path / "r").exists()
