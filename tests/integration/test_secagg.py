"""Secure aggregation in runs (secagg.bits > 0, docs/secagg.md): the masked modular sum unmasks to the plain
sum, within the rounding bound when the bits are wide; the same on 1 and 2 ranks and resumed with dropouts;
wraps counted at 8 bits; too few survivors skip the round or stop the run; bytes from the protocol's cost."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import (assert_refused, build_trainer, metrics, one_two_resumed, run_cli, summary, trained_model,
                      train_ok, write_config)
from distfl import dist
from distfl.config import load_config
from distfl.federation.aggregate import Segment, StatBuffer, round_segments
from distfl.privacy.distributed_accounting import ddgauss_epsilon, skellam_epsilon
from distfl.secagg import cost
from distfl.secagg.aggregator import SecureAggregator

WIDE = ("secagg.bits=56", "secagg.scale_bits=40", "secagg.verify=true")


def _sums(aggregator, terms, weights, clients):
    for client, term, weight in zip(clients, terms, weights):
        aggregator.begin([client])
        aggregator.add("delta", term, weight)
        aggregator.add("clients", 1)
    return aggregator.reduce(dist.init("cpu", 1))


def test_wide_secure_sums_are_the_plain_sums_within_the_rounding_bound(tmp_path):
    cfg = load_config(str(write_config(tmp_path / "c.yaml")), list(WIDE))
    segments = round_segments([Segment("delta", 1000)], 10)
    generator = torch.Generator().manual_seed(0)
    terms = [torch.randn(1000, generator=generator) * 0.1 for _ in range(5)]
    weights, clients = [0.1, 0.3, 0.2, 0.25, 0.15], [7, 1, 4, 9, 2]
    secure = _sums(SecureAggregator(segments, torch.device("cpu"), 5, cfg=cfg, round_idx=1, selected=clients,
                                    senders=clients), terms, weights, clients)
    plain = _sums(StatBuffer(segments, torch.device("cpu"), 5), terms, weights, clients)
    # Each term: stochastic rounding (< 1 unit) here, rounding to nearest (<= 1/2 unit) in the exact sum.
    difference = float((secure["delta"] - plain["delta"]).abs().max())
    assert 0 < difference <= 5 * 1.5 * 2.0**-40
    assert secure.scalar("clients") == 5 and secure.metrics["secagg_wraps"] == 0
    # Terms on the grid (multiples of 2^-40) are summed exactly: the plain sum bit for bit.
    on_grid = [torch.round(t * 2.0**40) * 2.0**-40 for t in terms]
    secure = _sums(SecureAggregator(segments, torch.device("cpu"), 5, cfg=cfg, round_idx=1, selected=clients,
                                    senders=clients), on_grid, [1.0] * 5, clients)
    plain = _sums(StatBuffer(segments, torch.device("cpu"), 5), on_grid, [1.0] * 5, clients)
    assert torch.equal(secure["delta"], plain["delta"])


def test_a_wide_secure_round_gives_the_plain_model_within_the_rounding_bound(tmp_path):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 1}, checkpoint={"every": 1})
    train_ok(config, f"output.dir={tmp_path / 'plain'}")
    train_ok(config, f"output.dir={tmp_path / 'secure'}", *WIDE)
    plain, secure = trained_model(tmp_path / "plain")[3].params, trained_model(tmp_path / "secure")[3].params
    # The sum of 5 clients' terms is within 5 x 1.5 units of 2^-40 of the exact sum; the float32 model
    # step rounds twice (the update to float32, then the sum), so a parameter may move by up to two units in
    # its last place. Measured: 4 of the 8,970 parameters differ, 3 by one float32 unit, 1 by two.
    larger = torch.maximum(plain.abs(), secure.abs())
    ulp = (torch.nextafter(larger, torch.tensor(float("inf"))) - larger).double()
    difference = (secure.double() - plain.double()).abs()
    assert bool((difference <= 5 * 1.5 * 2.0**-40 + 2 * ulp).all())
    assert int((difference > 0).sum()) < plain.numel() // 100


DDGAUSS = ("secagg.bits=20", "secagg.scale_bits=12", "privacy.mechanism=ddgauss", "privacy.delta=1e-5",
           "privacy.clip_norm=1.0", "algorithm.weighting=uniform")


@pytest.mark.parametrize("private", [False, True])
def test_secure_runs_are_the_same_on_one_two_ranks_and_resumed_with_dropouts(tmp_path, private):
    config = write_config(tmp_path / "c.yaml", system={"dropout": 0.3})
    dp = [*DDGAUSS, "privacy.noise_multiplier=0.5"] if private else ["secagg.bits=24", "secagg.scale_bits=16"]
    one, _, resumed = one_two_resumed(config, tmp_path, *dp, "secagg.verify=true", "secagg.neighbours=2")
    if private:
        assert one["privacy"]["epsilon"] == resumed["privacy"]["epsilon"]
        assert one["privacy"]["fewest_survivors"] < 5  # the accountant counts the survivors' noise only
    rows = metrics(tmp_path / "one")
    assert any(r["secagg_survivors"] < 5 for r in rows) and all(r["secagg_wraps"] == 0 for r in rows)
    # A dropped client's masks with its neighbours are recovered: more secrets revealed than survivors.
    assert any(r["secagg_revealed"] > r["secagg_survivors"] for r in rows)


def test_wraps_are_counted_at_8_bits_and_not_at_32(tmp_path):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 2})
    train_ok(config, f"output.dir={tmp_path / 'b8'}", "secagg.bits=8", "secagg.scale_bits=14", "secagg.verify=true")
    train_ok(config, f"output.dir={tmp_path / 'b32'}", "secagg.bits=32", "secagg.scale_bits=14")
    assert all(r["secagg_wraps"] > 0 for r in metrics(tmp_path / "b8"))
    assert all(r["secagg_wraps"] == 0 for r in metrics(tmp_path / "b32"))


def test_too_few_survivors_skip_the_round_or_stop_the_run(tmp_path):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 2}, checkpoint={"every": 1})
    proc = run_cli(["train", str(config), f"output.dir={tmp_path / 'skip'}", "secagg.bits=32", "secagg.threshold=6"])
    assert proc.returncode == 0, proc.stderr
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "secure aggregation failed" in line]
    assert said == [f"round {t}: secure aggregation failed: 5 client(s) reported, fewer than secagg.threshold=6"
                    for t in (1, 2)]
    assert [r["secagg_failed"] for r in metrics(tmp_path / "skip")] == [1, 1]
    start = build_trainer(config, tmp_path / "fresh").global_params
    assert torch.equal(trained_model(tmp_path / "skip")[3].params, start)  # no server step was taken
    proc = run_cli(["train", str(config), f"output.dir={tmp_path / 'stop'}", "secagg.bits=32", "secagg.threshold=6",
                    "secagg.on_failure=stop"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1:] == [
        "distfl: error: round 1: secure aggregation failed: 5 client(s) reported, fewer than secagg.threshold=6 "
        "(secagg.on_failure=stop)"]


def test_bytes_up_are_the_protocols(tmp_path):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 1})
    train_ok(config, f"output.dir={tmp_path / 'plain'}")
    train_ok(config, f"output.dir={tmp_path / 'secure'}", "secagg.bits=20", "secagg.neighbours=2")
    (row,) = metrics(tmp_path / "plain")
    (secure,) = metrics(tmp_path / "secure")
    values = row["bytes_up"] // 5 // 4  # float32 values of each client's update
    assert secure["bytes_up"] == 5 * cost.upload_bytes(values, 20, 2)
    assert secure["bytes_down"] == row["bytes_down"] + 5 * cost.download_bytes(2)


def test_secure_aggregation_refuses_what_it_cannot_serve(tmp_path):
    config = write_config(tmp_path / "c.yaml")
    assert_refused(config, tmp_path / "a", ["secagg.bits=16", "compression.up=topk"], "compression.up=topk")
    assert_refused(config, tmp_path / "b", ["secagg.bits=16", "secagg.neighbours=3"], "secagg.neighbours must be even")
    assert_refused(config, tmp_path / "c", ["secagg.bits=1"], "secagg.bits must be 0 (off) or in [2, 56]")


@pytest.mark.parametrize("mechanism", ["ddgauss", "skellam"])
def test_distributed_dp_trains_and_reports_the_accountants_epsilon(tmp_path, mechanism):
    config = write_config(tmp_path / "c.yaml")
    run = tmp_path / mechanism
    done = train_ok(config, f"output.dir={run}", *DDGAUSS, f"privacy.mechanism={mechanism}",
                    "privacy.noise_multiplier=0.2")
    rows = metrics(run)
    assert not any("train_loss" in r for r in rows)  # withheld, as in every private run (docs/privacy.md)
    assert done["model_sha256"] != train_ok(config, f"output.dir={run}_untrained", *DDGAUSS, f"privacy.mechanism={mechanism}",
                                            "privacy.noise_multiplier=0.2", "train.rounds=1")["model_sha256"]
    # 5 survivors a round, each adding noise of stddev 0.2 x 1.0 / sqrt(5); the MLP's 8,970 values padded
    # to 16,384 for the rotation; 2^12 grid steps a unit; no sampling amplification.
    common = dict(scale=2.0**12, l2_clip=1.0, beta=math.exp(-0.5), dim=16384, q=1.0, delta=1e-5)
    local = 0.2 / math.sqrt(5)
    for row in rows:
        expected = (ddgauss_epsilon(local_sigma=local, num_clients=5, steps=row["round"], **common)
                    if mechanism == "ddgauss" else
                    skellam_epsilon(central_sigma=math.sqrt(5) * local, steps=row["round"], **common))
        assert row["privacy_epsilon"] == expected
    assert done["privacy"]["epsilon"] == rows[-1]["privacy_epsilon"] and done["privacy"]["model"] == "distributed"
    assert "bytes_up" not in rows[0]  # withheld under DP: they count the clients


def test_distributed_dp_refuses_what_it_cannot_serve(tmp_path):
    config = write_config(tmp_path / "c.yaml")
    base = ["privacy.mechanism=ddgauss", "privacy.delta=1e-5", "algorithm.weighting=uniform"]
    assert_refused(config, tmp_path / "a", [*base, "privacy.noise_multiplier=1"], "set secagg.bits")
    assert_refused(config, tmp_path / "b", [*base, "secagg.bits=20", "privacy.target_epsilon=3",
                                            "privacy.noise_multiplier=1"],
                   "needs exactly one of privacy.noise_multiplier (>= 0) and privacy.target_epsilon")
    assert_refused(config, tmp_path / "c", ["secagg.bits=20", "privacy.mechanism=gaussian", "privacy.delta=1e-5",
                                            "privacy.noise_multiplier=1", "algorithm.weighting=uniform"],
                   "use privacy.mechanism=ddgauss or skellam")


def test_distributed_dp_refuses_another_compressor_and_counts_its_own_bits(tmp_path):
    config = write_config(tmp_path / "c.yaml")
    for compressor in ("qsgd", "topk", "fp16"):
        assert_refused(config, tmp_path / compressor, [*DDGAUSS, "privacy.noise_multiplier=1",
                                                       f"compression.up={compressor}"],
                       f"privacy.mechanism=ddgauss with compression.up={compressor}: the distributed-DP pipeline is "
                       "its own compressor")
    # What the papers compose: the rotated update (8,970 values padded to 16,384) at secagg.bits bits, under
    # SecAgg's messages (4 neighbours of 5 clients), and the bookkeeping segments' own bytes.
    cfg = load_config(str(config), [*DDGAUSS, "privacy.noise_multiplier=1", "secagg.bits=12"])
    trainer = build_trainer(config, tmp_path / "bytes", *DDGAUSS, "privacy.noise_multiplier=1", "secagg.bits=12")
    try:
        segments = round_segments(trainer.algorithm.segments(), 1)
    finally:
        trainer.close()
    from distfl.secagg.aggregator import upload_bytes

    other = sum(s.nbytes for s in segments if not (s.kind == "fixed" and s.wire_bytes > 0 and s.numel > 0))
    assert upload_bytes(cfg, segments, 5) == cost.upload_bytes(16384, 12, 4) + other


def test_target_epsilon_calibrates_distributed_dp_and_the_summary_records_it(tmp_path):
    from distfl.secagg.aggregator import _distributed_dp, epsilon

    config = write_config(tmp_path / "c.yaml")
    run = tmp_path / "calibrated"
    proc = run_cli(["train", str(config), f"output.dir={run}", *DDGAUSS, "privacy.target_epsilon=20"])
    assert proc.returncode == 0, proc.stderr
    assert "privacy: user-level distributed DP (ddgauss) under secure aggregation" in proc.stdout + proc.stderr
    p = summary(run)["privacy"]
    assert p["calibrated"] and p["target_epsilon"] == 20 and p["calibration_survivors"] == 5
    cfg = load_config(str(config), [*DDGAUSS, "privacy.target_epsilon=20"])
    rounds = cfg.train.rounds
    spent = [epsilon(_distributed_dp(cfg, z), 5, 16384, rounds, 1e-5) for z in (p["noise_multiplier"],
                                                                               p["noise_multiplier"] * (1 - 1e-4))]
    assert p["epsilon"] == spent[0] <= 20 < spent[1]  # every client survived: the run spent what was planned


def test_an_unreachable_target_epsilon_is_one_line(tmp_path):
    config = write_config(tmp_path / "c.yaml")
    proc = run_cli(["train", str(config), f"output.dir={tmp_path / 'r'}", *DDGAUSS, "privacy.target_epsilon=1e-6"])
    assert proc.returncode == 2 and not (tmp_path / "r").exists()
    assert proc.stderr.strip().splitlines() == [
        "distfl: error: privacy.target_epsilon=1e-06 is out of reach for privacy.mechanism=ddgauss at secagg.bits=20, "
        "secagg.scale_bits=12 over 6 rounds with 5 survivors a round: even noise_multiplier=10000 spends epsilon "
        f"{proc.stderr.split('spends epsilon ')[1].split(' ')[0]} (the rounding's sensitivity grows as scale_bits "
        "falls; raise it or the target)"]
