"""A second aggregator plugs in by aggregation.aggregator alone (docs/extending.md, An aggregator): a toy one,
defined only here, that sums integers modulo 2^b as a secure aggregation would (without its masks), runs
FedAvg, SCAFFOLD and FedProx the same on 1 and 2 ranks and resumed; the default stays the exact sum."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distfl import dist
from distfl.federation.aggregate import Aggregator, Sums

HERE = Path(__file__).resolve().parent
TOY = "test_aggregator:ModularSum"  # this file, on the runs' PYTHONPATH


class ModularSum(Aggregator):
    """Each term as the integer round(weight x value x 2^SCALE) (int segments: weight x value) modulo 2^BITS,
    summed modulo 2^BITS over clients and ranks, read back as the signed residue times 2^-SCALE."""

    BITS, SCALE = 48, 24

    def __init__(self, segments, device, max_terms):
        self.segments = {s.name: s for s in segments}
        self.sums = {s.name: torch.zeros(s.numel, dtype=torch.int64, device=device) for s in segments}

    def add(self, name, value, weight=1.0):
        segment, sums = self.segments[name], self.sums[name]
        scale = 1.0 if segment.kind == "int" else 2.0**self.SCALE
        value = torch.as_tensor(value).to(device=sums.device, dtype=torch.float64).reshape(-1)
        term = torch.round(value * (float(weight) * scale)).to(torch.int64)
        self.sums[name] = torch.remainder(sums + term, 2**self.BITS)

    def reduce(self, ctx, name="round_stats"):
        flat = torch.cat(list(self.sums.values()))
        dist.all_reduce_sum(flat, ctx, name=name)
        flat = torch.remainder(flat, 2**self.BITS)
        signed = torch.where(flat >= 2 ** (self.BITS - 1), flat - 2**self.BITS, flat)
        sums, offset = {}, 0
        for segment in self.segments.values():
            part = signed[offset:offset + segment.numel]
            sums[segment.name] = part if segment.kind == "int" else part.to(torch.float64) * 2.0**-self.SCALE
            offset += segment.numel
        return ModularSums(sums)

    def unit(self, name):
        return 2.0**-self.SCALE

    @property
    def nbytes(self):
        return 8 * sum(s.numel() for s in self.sums.values())


class ModularSums(Sums):
    def __init__(self, sums):
        self.sums = sums

    def __getitem__(self, name):
        return self.sums[name].clone()


@pytest.mark.parametrize("method", ["fedavg", "scaffold", "fedprox"])
def test_a_modular_aggregator_is_the_same_on_one_two_and_resumed(tmp_path, method):
    from conftest import one_two_resumed, train_ok, write_config
    from test_system import BEFORE  # the default (exact) aggregator's models of these runs, pinned

    cfg = write_config(tmp_path / "c.yaml", algorithm={"name": method})
    exact = train_ok(cfg, f"output.dir={tmp_path / 'exact'}")
    assert exact["model_sha256"] == BEFORE[method]
    one, two, resumed = one_two_resumed(cfg, tmp_path, f"aggregation.aggregator={TOY}", paths=[HERE])
    assert one["bytes_up"] == two["bytes_up"] == resumed["bytes_up"] == exact["bytes_up"] > 0  # totals survive a resume
    # Its own sums (a coarser unit) make another model, as good as the exact sum's.
    assert one["model_sha256"] != exact["model_sha256"]
    assert abs(one["final_test_acc"] - exact["final_test_acc"]) <= 0.02


def test_the_modular_aggregator_gives_the_sums_it_was_given():
    ctx = dist.init("cpu", 1)
    from distfl.federation.aggregate import Segment, round_segments

    toy = ModularSum(round_segments([Segment("delta", 3)], 10), torch.device("cpu"), 2)
    toy.add("delta", torch.tensor([0.5, -1.25, 3.0]), 0.5)
    toy.add("delta", torch.tensor([0.25, 0.25, -4.0]), 0.5)
    toy.add("clients", 1)
    toy.add("clients", 1)
    sums = toy.reduce(ctx)
    assert sums["delta"].tolist() == [0.375, -0.5, -0.5] and sums.scalar("clients") == 2
    assert sums.problems() == {}


@pytest.mark.parametrize("name, says", [
    ("no_such_module:Sum", "cannot import module 'no_such_module'"),
    ("test_aggregator:ModularSums", "not a subclass of distfl.federation.aggregate.Aggregator"),
    ("modular", "aggregation.aggregator"),
])
def test_a_bad_aggregator_is_refused_before_any_work(tmp_path, name, says):
    from conftest import run_cli, write_config

    cfg = write_config(tmp_path / "c.yaml")
    run = tmp_path / "run"
    proc = run_cli(["train", str(cfg), f"output.dir={run}", f"aggregation.aggregator={name}"])
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not run.exists()
