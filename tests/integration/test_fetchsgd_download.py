"""FetchSGD (compression.up=sketch) and compressed downloads (compression.down) in real runs
(docs/compression.md): a wide sketch with one client is top-k bit for bit, both are the same model on 1
and 2 ranks and after a resume (the server's sketches checkpointed, the download's rounding keyed), the
bytes recomputed from their formulas, and refusals before any work."""
import math

import pytest

from conftest import (SMALL, assert_packs_train_as_one_at_a_time, assert_refused, metrics, one_two_resumed,
                      train_ok, write_config)
from distfl.compression import QSGD

LOGREG = {**SMALL, "model": {"name": "mclr"}}  # 8 x 8 inputs, 10 classes: 650 parameters, no buffers
NUMEL = 64 * 10 + 10


def test_fetchsgd_with_one_client_and_a_wide_sketch_is_top_k_bit_for_bit(tmp_path):
    """With one client, lr 1, no momentum and columns >> d, the sketch reads every coordinate back
    exactly, so the first round applies the top-k of the client's update: the top-k run's model."""
    config = write_config(tmp_path / "c.yaml", LOGREG, train={**SMALL["train"], "rounds": 1, "clients_per_round": 1})
    top = train_ok(config, f"output.dir={tmp_path / 'top'}", "compression.up=topk", "compression.density=0.1")
    sketch = train_ok(config, f"output.dir={tmp_path / 'sketch'}", "compression.up=sketch", "compression.density=0.1",
                      "compression.rows=5", f"compression.columns={1 << 16}")
    plain = train_ok(config, f"output.dir={tmp_path / 'plain'}")
    assert sketch["model_sha256"] == top["model_sha256"] != plain["model_sha256"]


def test_fetchsgd_is_the_same_on_one_and_two_ranks_and_resumed_and_sends_its_sketch(tmp_path):
    config = write_config(tmp_path / "c.yaml", LOGREG)
    one, _, _ = one_two_resumed(config, tmp_path, "compression.up=sketch", "compression.density=0.05",
                                "compression.rows=3", "compression.columns=100", "server.momentum=0.9")
    rows = [row for row in metrics(tmp_path / "one") if "bytes_up" in row]
    assert len(rows) == 6 and all(row["bytes_up"] == 5 * 3 * 100 * 4 for row in rows)


def test_compressed_downloads_are_counted_and_none_is_the_plain_run(tmp_path):
    config = write_config(tmp_path / "c.yaml", LOGREG, train={**SMALL["train"], "rounds": 2})
    plain = train_ok(config, f"output.dir={tmp_path / 'plain'}")
    none = train_ok(config, f"output.dir={tmp_path / 'none'}", "compression.down=none")
    assert none["model_sha256"] == plain["model_sha256"]
    per_client = {"fp16": 2 * NUMEL, "qsgd": math.ceil((QSGD(4).bits(640) + QSGD(4).bits(10)) / 8)}
    for kind, extra in (("fp16", []), ("qsgd", ["compression.down_bits=4"])):
        run = train_ok(config, f"output.dir={tmp_path / kind}", f"compression.down={kind}", *extra)
        assert run["model_sha256"] != plain["model_sha256"]
        for row in metrics(tmp_path / kind):
            if "bytes_down" in row:
                assert row["bytes_down"] == 5 * per_client[kind] and row["bytes_up"] == 5 * 4 * NUMEL, row


def test_quantised_downloads_are_the_same_on_one_and_two_ranks_resumed_and_in_packs(tmp_path):
    config = write_config(tmp_path / "c.yaml", SMALL)
    one_two_resumed(config, tmp_path, "compression.down=qsgd", "compression.down_bits=6", "compression.up=topk",
                    "compression.density=0.2")
    assert_packs_train_as_one_at_a_time(config, tmp_path / "packs", 5, "compression.down=qsgd")


@pytest.mark.parametrize("overrides,says", [
    (["algorithm.name=scaffold", "compression.up=sketch"], "use fedavg or fedprox"),
    (["server.optimizer=adam", "compression.up=sketch"], "use server.optimizer=sgd"),
    (["compression.up=sketch", "privacy.mechanism=gaussian", "privacy.delta=1e-3", "algorithm.weighting=uniform",
      "privacy.noise_multiplier=0.5", "privacy.clip_norm=1", "privacy.secure_noise=false"], "a FetchSGD client sends a sketch"),
    (["compression.up=sketch", "aggregation.fedbn=true", "model.name=simplecnn"], "FedBN keeps BatchNorm coordinates"),
    (["compression.down=fp16", "system.async_mode=fedbuff", "system.buffer_size=5", "system.concurrency=5"],
     "asynchronous clients start from the model version"),
])
def test_settings_no_run_can_serve_are_refused_before_any_work(tmp_path, overrides, says):
    config = write_config(tmp_path / "c.yaml", LOGREG)
    assert_refused(config, tmp_path / "run", overrides, says)
