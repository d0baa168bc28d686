"""Compressed updates in real runs (compression.up, docs/compression.md): identities that give the plain
run's model bit for bit, the same model on 1 and 2 ranks and resumed with error feedback and a random
compressor, packs as one at a time, the bytes on the wire recomputed from the compressors' formulas, and
refusals before any work."""
import math

import pytest
import torch

from conftest import (SMALL, assert_packs_train_as_one_at_a_time, assert_refused, metrics, one_two_resumed,
                      train_ok, write_config)
from distfl.compression import QSGD, TopK

FEDAVG = {**SMALL, "train": {**SMALL["train"], "rounds": 4}}


@pytest.mark.parametrize("identity", [["compression.up=topk", "compression.density=1.0"],
                                      ["compression.up=randk", "compression.density=1.0"]],
                         ids=["topk-density-1", "randk-k-equals-d"])
@pytest.mark.parametrize("method", ["fedavg", "scaffold"])
def test_identity_compressors_give_the_plain_model_bit_for_bit(tmp_path, identity, method):
    config = write_config(tmp_path / "c.yaml", FEDAVG, algorithm={"name": method})
    plain = train_ok(config, f"output.dir={tmp_path / 'plain'}")
    compressed = train_ok(config, f"output.dir={tmp_path / 'compressed'}", *identity)
    assert compressed["model_sha256"] == plain["model_sha256"]


def test_compression_changes_the_model_and_reports_its_error(tmp_path):
    config = write_config(tmp_path / "c.yaml", FEDAVG)
    plain = train_ok(config, f"output.dir={tmp_path / 'plain'}")
    sparse = train_ok(config, f"output.dir={tmp_path / 'sparse'}", "compression.up=topk", "compression.density=0.1")
    assert sparse["model_sha256"] != plain["model_sha256"]
    errors = [row["compression_vnmse"] for row in metrics(tmp_path / "sparse") if "compression_vnmse" in row]
    assert len(errors) == 4 and all(0 < e < 1 for e in errors)


def test_bytes_up_are_the_compressors_sizes(tmp_path):
    """FedAvg on the MLP: each client sends its delta (top-k's k values and indices or bitmap) and its
    buffers; SCAFFOLD also its control delta, compressed alike."""
    from distfl.models import build_model
    from distfl.config.schema import ModelConfig

    numel = sum(p.numel() for p in build_model(ModelConfig(name="mlp"), (1, 8, 8), 10).parameters())
    for method, segments in (("fedavg", 1), ("scaffold", 2)):
        config = write_config(tmp_path / f"{method}.yaml", FEDAVG, algorithm={"name": method})
        run = tmp_path / method
        train_ok(config, f"output.dir={run}", "compression.up=qsgd", "compression.bits=4")
        per_client = segments * math.ceil(QSGD(bits=4).bits(numel) / 8)
        for row in metrics(run):
            if "bytes_up" in row:
                assert row["bytes_up"] == 5 * per_client, (method, row)
    top = write_config(tmp_path / "top.yaml", FEDAVG)
    train_ok(top, f"output.dir={tmp_path / 'top'}", "compression.up=topk", "compression.density=0.05")
    assert metrics(tmp_path / "top")[0]["bytes_up"] == 5 * math.ceil(TopK(density=0.05).bits(numel) / 8)


@pytest.mark.parametrize("compressor", [["compression.up=randk", "compression.density=0.2"],
                                        ["compression.up=qsgd", "compression.bits=3"],
                                        ["compression.up=powersgd", "compression.rank=2"]],
                         ids=["randk", "qsgd", "powersgd"])
def test_error_feedback_runs_are_the_same_on_one_and_two_ranks_and_resumed(tmp_path, compressor):
    config = write_config(tmp_path / "c.yaml", SMALL, algorithm={"name": "scaffold"})
    one_two_resumed(config, tmp_path, *compressor, "compression.error_feedback=true")


def test_error_feedback_keeps_a_residual_per_client(tmp_path):
    from conftest import build_trainer

    config = write_config(tmp_path / "c.yaml", FEDAVG)
    trainer = build_trainer(config, tmp_path / "run", "compression.up=topk", "compression.density=0.05",
                            "compression.error_feedback=true")
    try:
        trainer.run_round(1)
        states = [trainer.store.peek(c) for c in range(12)]
        trained = [s for s in states if s is not None]
        assert len(trained) == 5
        assert all(float(s["compression_residual.delta"].abs().sum()) > 0 for s in trained)
    finally:
        trainer.close()


def test_packs_compress_as_one_at_a_time(tmp_path):
    config = write_config(tmp_path / "c.yaml", FEDAVG)
    assert_packs_train_as_one_at_a_time(config, tmp_path, 5, "compression.up=qsgd", "compression.bits=4")


@pytest.mark.parametrize("overrides,says", [
    (["algorithm.name=fednova", "compression.up=topk"], "algorithm.name=fednova sends more than its update"),
    (["aggregation.mask=gma", "compression.up=qsgd"], "GMA's sign agreement"),
    (["compression.up=qsgd", "compression.bits=1"], "compression.bits must be >= 2"),
    (["compression.up=eden", "compression.bits=9"], "at most 8"),
    (["compression.up=topk", "compression.error_feedback=true", "system.async_mode=fedbuff", "system.buffer_size=5",
      "system.concurrency=5"], "does not keep"),
])
def test_settings_no_run_can_serve_are_refused_before_any_work(tmp_path, overrides, says):
    config = write_config(tmp_path / "c.yaml", FEDAVG)
    assert_refused(config, tmp_path / "run", overrides, says)


def test_under_dp_the_decoded_update_is_clipped_and_noised_and_its_error_withheld(tmp_path):
    """Compression inside the Gaussian mechanism: a private top-k run trains, releases no compression
    error (computed from each update without noise), and differs from the private uncompressed run."""
    dp = ["privacy.mechanism=gaussian", "privacy.delta=1e-3", "algorithm.weighting=uniform",
          "privacy.secure_noise=false", "privacy.noise_multiplier=0.5", "privacy.clip_norm=1.0"]
    config = write_config(tmp_path / "c.yaml", FEDAVG)
    plain = train_ok(config, f"output.dir={tmp_path / 'plain'}", *dp)
    sparse = train_ok(config, f"output.dir={tmp_path / 'sparse'}", *dp, "compression.up=topk", "compression.density=0.1")
    assert sparse["model_sha256"] != plain["model_sha256"]
    assert not any("compression_vnmse" in row for row in metrics(tmp_path / "sparse"))


def test_fedbuff_compresses_the_buffered_updates_the_same_on_two_ranks(tmp_path):
    buffered = ("system.speed=lognormal:0,1", "system.bandwidth=uniform:100,1000", "system.async_mode=fedbuff",
                "system.buffer_size=2", "system.concurrency=6", "system.staleness=polynomial",
                "system.max_staleness=3")
    config = write_config(tmp_path / "c.yaml", FEDAVG)
    one = train_ok(config, f"output.dir={tmp_path / 'one'}", *buffered, "compression.up=randk", "compression.density=0.3")
    two = train_ok(config, f"output.dir={tmp_path / 'two'}", *buffered, "compression.up=randk", "compression.density=0.3",
                   nproc=2)
    plain = train_ok(config, f"output.dir={tmp_path / 'plain'}", *buffered)
    assert one["model_sha256"] == two["model_sha256"] != plain["model_sha256"]
