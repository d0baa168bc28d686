"""train.local_steps: a fixed number of local SGD steps per round (FedADC's H), drawn from consecutive
random passes over the client's data; and the sample count every round statistic relies on."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import metrics, train_ok
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
