"""Local SGD (federation/local.py): a round's batches (train.local_steps: a fixed number of steps per
round, FedADC's H, drawn from consecutive random passes over the client's data; the sample count every
round statistic relies on), and the step's fast paths (gradients handed over by autograd instead of
accumulated into the flat gradient, and channels_last image batches: runtime.channels_last)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import build_trainer, metrics, train_ok, write_config
from distfl.algorithms.base import Algorithm
from distfl.federation.local import local_batches, local_steps, samples_trained


def _client(n: int):
    """A client whose sample k has the value 1000 + k, so a batch shows which samples it holds."""
    data = SimpleNamespace(train_x=torch.arange(1000, 1000 + n).float(), train_y=torch.arange(n), augment=None)
    return data, torch.arange(n)


def _batches(n: int, batch: int, epochs: int, steps: int) -> list[list[int]]:
    data, indices = _client(n)
    torch.manual_seed(7)
    cfg = SimpleNamespace(batch_size=batch, local_epochs=epochs, local_steps=steps)
    return [y.tolist() for _, y in local_batches(data, indices, cfg)]


def _reference(n: int, batch: int, count: int) -> list[list[int]]:
    """`count` batches cut from a fresh torch.randperm(n) per pass, the pass's last batch kept partial."""
    torch.manual_seed(7)
    out = []
    while len(out) < count:
        order = torch.randperm(n).tolist()
        out += [order[s : s + batch] for s in range(0, n, batch)]
    return out[:count]


@pytest.mark.parametrize("n,batch,steps", [(10, 4, 2), (10, 4, 3), (10, 4, 7), (10, 5, 6), (3, 8, 5)])
def test_fixed_steps_are_consecutive_passes_cut_at_h(n, batch, steps):
    got = _batches(n, batch, 1, steps)
    assert got == _reference(n, batch, steps)
    assert local_steps(n, batch, 1, steps) == steps
    assert samples_trained(n, batch, 1, steps) == sum(map(len, got))


@pytest.mark.parametrize("n,batch,epochs", [(10, 4, 1), (10, 4, 2), (9, 3, 3)])
def test_without_fixed_steps_a_round_is_whole_epochs(n, batch, epochs):
    got = _batches(n, batch, epochs, 0)
    per_pass = -(-n // batch)
    assert got == _reference(n, batch, epochs * per_pass)
    assert local_steps(n, batch, epochs) == epochs * per_pass
    assert samples_trained(n, batch, epochs) == n * epochs == sum(map(len, got))
    # Each pass is a permutation: every sample once per epoch.
    for e in range(epochs):
        assert sorted(sum(got[e * per_pass : (e + 1) * per_pass], [])) == list(range(n))


def test_a_run_with_fixed_steps_counts_the_samples_it_trained_on(tmp_path, small_config):
    """Every client of every round takes exactly H batches of 16: the run's sample count (one exact sum
    over the cohort) is 5 clients x H x 16 while H x 16 is below every client's size."""
    h = 2  # 32 samples: the smallest client of SMALL's split holds more
    train_ok(small_config, f"output.dir={tmp_path / 'run'}", f"train.local_steps={h}")
    rows = [r for r in metrics(tmp_path / "run") if "samples_per_s" in r]
    assert len(rows) == 6
    per_round = {round(r["samples_per_s"] * r["round_s"]) for r in rows}
    assert per_round == {5 * h * 16}


# pfl_cnn on 3-channel 8x8 synthetic images: the convolutions and max-pool channels_last changes.
CONV = {"model": {"name": "pfl_cnn"}, "data": {"synthetic_channels": 3},
        "train": {"rounds": 3, "clients_per_round": 4}}


def trainer(tmp_path, name, *overrides, base=None):
    cfg_path = write_config(tmp_path / f"{name}.yaml", **(base or CONV))
    return build_trainer(cfg_path, tmp_path / name, *overrides)


def batch_formats(tr) -> set:
    """The memory formats of the batches the model trains on during round 1."""
    seen = set()

    def record(module, args):
        if module.training:
            x = args[0]
            seen.add("channels_last" if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
                     and not x.is_contiguous() else "contiguous")

    handle = tr.worker.module.register_forward_pre_hook(record)
    try:
        tr.run_round(1)
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize("setting,base,expected", [
    ("auto", CONV, {"channels_last"}),  # a model with convolutions, on the CPU
    ("off", CONV, {"contiguous"}),
    ("on", CONV, {"channels_last"}),
    ("auto", {"model": {"name": "mlp"}, "data": {"synthetic_channels": 3}}, {"contiguous"}),  # no convolution
    # Convolutions, but measured no faster with it (models.CHANNELS_LAST_ON_CPU); on is still honoured.
    ("auto", {"model": {"name": "lenet5"}, "data": {"synthetic_channels": 3, "synthetic_image_size": 28}},
     {"contiguous"}),
    ("on", {"model": {"name": "lenet5"}, "data": {"synthetic_channels": 3, "synthetic_image_size": 28}},
     {"channels_last"}),
])
def test_runtime_channels_last_sets_the_training_batches_format(tmp_path, setting, base, expected):
    tr = trainer(tmp_path, setting, f"runtime.channels_last={setting}", base=base)
    assert batch_formats(tr) == expected


def test_channels_last_changes_only_float_rounding(tmp_path):
    """The same function of the data: the two formats' models agree to float rounding after 3 rounds."""
    models = {}
    for setting in ("on", "off"):
        tr = trainer(tmp_path, setting, f"runtime.channels_last={setting}")
        for t in (1, 2, 3):
            tr.run_round(t)
        models[setting] = tr.global_params
    assert torch.allclose(models["on"], models["off"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("extra", [[], ["train.momentum=0.9", "train.weight_decay=0.001"]])
def test_handed_over_gradients_equal_the_flat_gradient_step(tmp_path, monkeypatch, extra):
    """Plain SGD adds each parameter's gradient directly; forcing the flat-gradient path (what a method
    with a gradient correction takes) gives the bit-identical model. With momentum and weight decay
    both runs take the flat path: the check that forcing it changes nothing else."""
    direct = trainer(tmp_path, "direct", *extra)
    for t in (1, 2):
        direct.run_round(t)
    monkeypatch.setattr(Algorithm, "overrides", lambda self, hook: hook == "correct_gradient")
    flat = trainer(tmp_path, "flat", *extra)
    for t in (1, 2):
        flat.run_round(t)
    assert torch.equal(direct.global_params, flat.global_params)
    # The parameters' .grad are the views into the flat gradient again after local training.
    worker = direct.worker
    assert all(p.grad is not None and p.grad.data_ptr() == v.data_ptr()
               for p, v in zip(worker.param_tensors, worker.grad_views))


def test_channels_last_run_one_rank_equals_two_ranks_and_resume(tmp_path):
    cfg = write_config(tmp_path / "conv.yaml", **CONV)
    through = train_ok(cfg, f"output.dir={tmp_path / 'through'}", "runtime.channels_last=on")
    two = train_ok(cfg, f"output.dir={tmp_path / 'two'}", "runtime.channels_last=on", nproc=2)
    train_ok(cfg, f"output.dir={tmp_path / 'stopped'}", "runtime.channels_last=on", "train.rounds=2")
    resumed = train_ok(None, "train.rounds=3", resume=str(tmp_path / "stopped"))
    assert through["model_sha256"] == two["model_sha256"] == resumed["model_sha256"]


def test_a_checkpoint_from_before_channels_last_resumes_only_with_it_off(tmp_path):
    """A distfl without runtime.channels_last trained in NCHW: resuming its checkpoint with today's
    default (auto: channels_last for a conv model on CPU) is refused, and with runtime.channels_last=off
    it finishes as a run of NCHW batches from the start does."""
    import hashlib
    import json

    import yaml

    from conftest import run_cli, summary
    from distfl.checkpoint import complete_checkpoints

    cfg = write_config(tmp_path / "conv.yaml", **CONV)
    through = train_ok(cfg, f"output.dir={tmp_path / 'through'}", "runtime.channels_last=off")
    train_ok(cfg, f"output.dir={tmp_path / 'old'}", "runtime.channels_last=off", "train.rounds=2")
    saved = tmp_path / "old" / "config.yaml"  # as an older distfl wrote them: no such key
    saved.write_text("".join(line for line in saved.read_text().splitlines(True) if "channels_last" not in line))
    for path in complete_checkpoints(tmp_path / "old"):
        state = torch.load(path / "state.pt", weights_only=False)
        del state["config"]["runtime"]["channels_last"]
        torch.save(state, path / "state.pt")
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["files"]["state.pt"] = hashlib.sha256((path / "state.pt").read_bytes()).hexdigest()
        (path / "manifest.json").write_text(json.dumps(manifest))
    proc = run_cli(["train", "--resume", tmp_path / "old", "train.rounds=3"])
    assert proc.returncode != 0 and "add runtime.channels_last=off to resume it as it ran" in proc.stderr
    # A sweep over that directory names the value it ran with, and the same fix, before anything runs.
    seed = yaml.safe_load(saved.read_text())["seed"]
    (tmp_path / "sweep").mkdir()
    (tmp_path / "old").rename(tmp_path / "sweep" / f"seed={seed}")
    proc = run_cli(["sweep", cfg, f"output.dir={tmp_path / 'sweep'}", "--seeds", seed])
    assert proc.returncode == 2 and "runtime.channels_last ('off' there, 'auto' now)" in proc.stderr
    assert "add runtime.channels_last=off to resume it as it ran" in proc.stderr
    (tmp_path / "sweep" / f"seed={seed}").rename(tmp_path / "old")
    proc = run_cli(["train", "--resume", tmp_path / "old", "train.rounds=3", "runtime.channels_last=off"])
    assert proc.returncode == 0, proc.stderr
    assert summary(tmp_path / "old")["model_sha256"] == through["model_sha256"]


def test_after_step_runs_after_every_step_on_both_paths(tmp_path, monkeypatch):
    """A method's after_step runs once per local step whether the step takes the plain-SGD path (no
    flat gradient) or the flat-gradient path (momentum): a plugin's after_step must not depend on it."""
    calls = []

    def count(self, w, lr, run):
        calls.append(lr)

    counts = {}
    for name, extra in (("plain", []), ("momentum", ["train.momentum=0.5"])):
        tr = trainer(tmp_path, name, *extra, base={"train": {"rounds": 1}})
        monkeypatch.setattr(type(tr.algorithm), "after_step", count)
        calls.clear()
        tr.run_round(1)
        counts[name] = len(calls)
    assert counts["plain"] == counts["momentum"] > 0


@pytest.mark.parametrize("extra", [[], ["train.momentum=0.9"]])
def test_a_clients_loss_sum_is_the_float64_sum_of_its_batches_in_order(tmp_path, small_config, extra):
    """On the host the pass's loss sum is read batch by batch as Python floats: the same IEEE double
    products and sums, in the same order, as float64 tensor ops on each batch's loss (the device path)."""
    from distfl.federation.local import seed_local_rng
    from distfl.federation.population import client_seed

    tr = build_trainer(small_config, tmp_path / "run", *extra)
    cohort = tr.population.cohort(tr.cfg.seed, 1, tr.cfg.train.clients_per_round)
    losses = []
    inner = tr.algorithm.local_loss

    def recording(model, x, y, run):
        loss = inner(model, x, y, run)
        losses.append((loss.detach().clone(), len(y)))
        return loss
    tr.algorithm.local_loss = recording
    for c in cohort:
        losses.clear()
        run = tr.client_run(c, 1, cohort)
        tr.worker.load(tr.global_params, tr.global_buffers)
        seed_local_rng(client_seed(tr.algorithm.seed, 1, c), tr.device)
        run.train()
        expected = torch.zeros((), dtype=torch.float64)
        for loss, size in losses:
            expected += loss.double() * size
        assert len(losses) == run.steps and float(expected) > 0
        assert run.loss_sum.dtype == torch.float64 and torch.equal(run.loss_sum, expected)
