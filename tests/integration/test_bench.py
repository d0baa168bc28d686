"""`distfl bench --quick`: it runs end to end and records what it should. No speed assertions here:
the speed targets are judged in the bench's own results (bench/results/results.md), never in tests."""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distfl.data.datasets import find_fmnist
from distfl.errors import DataError
from distfl.federation.aggregate import STANDARD_SEGMENTS
from distfl.models import build_model
from distfl.config.schema import ModelConfig


def _fmnist_available() -> bool:
    try:
        find_fmnist("./data", download=False)
    except DataError:
        return False
    return True


def _positive_numbers(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _positive_numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _positive_numbers(v)
    else:
        yield obj


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd}")
    return found


@pytest.mark.skipif(not _fmnist_available(), reason="the bench runs on real Fashion-MNIST, not installed here")
def test_bench_quick(tmp_path):
    import distfl.bench

    threads = torch.get_num_threads()
    out = tmp_path / "sub" / "results.json"
    rc = distfl.bench.main(argparse.Namespace(out=str(out), rounds=2, repeats=1, quick=True))
    assert rc == 0
    assert torch.get_num_threads() == threads  # the bench restores the process's thread count
    res = json.loads(out.read_text())
    assert out.with_suffix(".md").read_text() == res["table_markdown"]

    for key in ("date", "command", "machine", "workload", "raw", "medians", "overhead", "scaling",
                "collectives", "table_markdown"):
        assert key in res, key
    for key in ("platform", "cpu_count", "torch", "threads"):
        assert key in res["machine"], key
    assert res["machine"]["threads"] == 1
    assert res["workload"]["rounds"] == 2 and res["workload"]["repeats"] == 1
    assert len(res["workload"]["steps_per_round"]) == 2

    # Every raw timing: one per repeat, positive.
    raw = res["raw"]
    for key in ("fl_inprocess_s", "centralised_s", "rank1_s", "rank2_s", "ceiling_solo_s", "ceiling_pair_s"):
        assert len(raw[key]) == 1, key
    assert len(raw["ceiling_pair_s"][0]) == 2
    assert len(raw["rank1_round_s"][0]) == len(raw["rank2_round_s"][0]) == 2
    for value in _positive_numbers(raw):
        assert isinstance(value, float) and value > 0
    for key, value in res["medians"].items():
        assert value > 0, key
    for key in ("ratio_of_medians", "per_repeat", "target", "met"):
        assert key in res["overhead"], key
    for key in ("speedup", "per_repeat", "ceiling", "ceiling_per_repeat", "fraction_of_ceiling", "met",
                "fraction_met", "bit_identical"):
        assert key in res["scaling"], key
    assert res["scaling"]["speedup"] > 0 and res["scaling"]["ceiling"] > 0
    # 1 and 2 ranks train the same model bit for bit (the runner's guarantee).
    assert res["scaling"]["bit_identical"] is True

    # Exactly one all_reduce a round, of the FedAvg payload: delta (params) + float buffers + the
    # standard segments (loss_sum, samples, nonfinite), as int64.
    model = build_model(ModelConfig(name="simplecnn"), (1, 28, 28), 10)
    num_params = sum(p.numel() for p in model.parameters())
    num_buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())
    checks = 2 * 3  # two exactness counts per fixed statistic: loss_sum, delta, buffers
    expected = 8 * (num_params + num_buffers + sum(s.numel for s in STANDARD_SEGMENTS) + checks)
    col = res["collectives"]
    assert col["calls_per_round"] == 1
    assert col["bytes_per_round"] == expected == col["expected_bytes_per_round"]
    assert col["bytes_per_round_2rank_metrics"] == [expected]
    assert col["num_params"] == num_params == 44426
    assert col["num_buffers"] == num_buffers
    assert col["fp32_bytes_per_round"] == expected // 2
    assert col["calls_met"] and col["bytes_met"]

    # No subprocess outlives the bench, and its temp dir is gone.
    assert not Path(res["tmp_dir"]).exists()
    assert _processes_mentioning(res["tmp_dir"]) == []


def _shrink(workload: list[str]) -> list[str]:
    """The cross-device shape, shrunk: 20 clients of 10 8x8 images, 10 a round."""
    small = [o for o in workload if not o.startswith(("data.synthetic_train", "data.synthetic_image_size",
                                                       "partition.num_clients", "train.clients_per_round"))]
    return small + ["data.synthetic_train=200", "data.synthetic_image_size=8", "partition.num_clients=20",
                    "train.clients_per_round=10"]


def test_cross_device_suite_times_each_pack_size(tmp_path, monkeypatch):
    """`--suite cross-device` on a shrunken workload: every pack size timed, the packed model within
    float rounding of the one-at-a-time one, JSON and markdown written."""
    import distfl.bench
    import distfl.bench.cross_device as xdev

    monkeypatch.setattr(xdev, "WORKLOAD", _shrink(xdev.WORKLOAD))
    out = tmp_path / "cross-device.json"
    args = argparse.Namespace(out=str(out), rounds=2, repeats=1, quick=False, suite="cross-device",
                              pack_sizes="1,3,10")
    assert distfl.bench.main(args) == 0
    res = json.loads(out.read_text())
    assert set(res["median_s_per_round"]) == {"1", "3", "10"}
    assert all(v > 0 for v in res["median_s_per_round"].values())
    assert res["max_abs_diff_vs_pack_1"]["1"] == 0.0
    assert all(v < 1e-4 for v in res["max_abs_diff_vs_pack_1"].values())
    assert "| 10 |" in out.with_suffix(".md").read_text()
    # The exact sum's own row: one client's update of the model's size, per million parameters.
    exact = res["exact_sum"]
    assert exact["num_params"] > 0 and exact["clients"] == 10
    assert exact["ms_per_client_per_mparam"] == exact["ms_per_client"] / (exact["num_params"] / 1e6) > 0
    assert "ms per client per million parameters" in out.with_suffix(".md").read_text()


def test_cross_device_ranks_sharing_the_device_train_the_same_model(tmp_path, monkeypatch):
    """`--ranks 1,2`: real torchrun runs (gloo) of the shrunken shape in packs of the largest pack size
    (5, a 2-rank share of 10 clients too); 1 rank and 2 ranks give the same final model, and each count's
    rate is its clients over its time."""
    import distfl.bench
    import distfl.bench.cross_device as xdev

    monkeypatch.setattr(xdev, "WORKLOAD", _shrink(xdev.WORKLOAD))
    out = tmp_path / "ranks.json"
    args = argparse.Namespace(out=str(out), rounds=2, repeats=1, quick=False, suite="cross-device",
                              pack_sizes="1,5", pfl_processes="", ranks="1,2", overrides=["train.lr=0.05"])
    assert distfl.bench.main(args) == 0
    res = json.loads(out.read_text())
    shared = res["ranks_sharing_device"]
    assert shared["pack_size"] == {"1": 5, "2": 5} and set(shared["median_s_per_round"]) == {"1", "2"}
    assert shared["bit_identical_at_equal_pack_size"] and len(shared["model_sha256_by_pack_size"]["5"]) == 1
    for n, s_per_round in shared["median_s_per_round"].items():
        assert shared["client_updates_per_s"][n] == 10 / s_per_round
    assert res["extra_overrides"] == ["train.lr=0.05"]
    assert res["pfl_research_processes"] == {} and "speedup_vs_pfl" not in res["best"]
    assert "| 2 |" in out.with_suffix(".md").read_text()


def test_cross_device_best_compares_the_fastest_of_each():
    """The comparison the suite reports: distfl's fastest configuration (a pack size or a rank count)
    against pfl-research's fastest process count, as pfl-research's time over distfl's."""
    from distfl.bench.cross_device import _best

    shared = {"pack_size": {"1": 50, "2": 25, "4": 13}, "median_s_per_round": {"1": 0.09, "2": 0.06, "4": 0.07}}
    pfl = {"1": {"s_per_round": 0.55}, "2": {"s_per_round": 0.40}, "3": "not measured (failed)"}
    best = _best({1: 0.56, 50: 0.08}, shared, pfl)
    assert best == {"distfl": "2 ranks, pack_size=25", "distfl_s_per_round": 0.06, "pfl_processes": 2,
                    "pfl_s_per_round": 0.40, "speedup_vs_pfl": 0.40 / 0.06}
    assert _best({1: 0.56, 50: 0.08}, None, {})["distfl"] == "pack_size=50"


def test_ranks_get_packs_of_at_most_their_share():
    """Packs are dealt whole: with 50 clients a round, 2 ranks get packs of 25 and 4 ranks of 13 (not 50,
    which would leave all but one rank idle); a smaller largest pack size is kept."""
    from distfl.bench.cross_device import rank_pack_size

    assert [rank_pack_size(50, 50, n) for n in (1, 2, 3, 4)] == [50, 25, 17, 13]
    assert [rank_pack_size(10, 50, n) for n in (1, 2, 4)] == [10, 10, 10]


@pytest.mark.parametrize("flag,value", [("--ranks", "0"), ("--ranks", "1,1"), ("--pfl-processes", "x"),
                                        ("--pfl-processes", "2,-1")])
def test_cross_device_counts_are_checked_before_any_work(flag, value, capsys):
    from distfl.cli import main

    assert main(["bench", "--suite", "cross-device", flag, value]) != 0
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("suite", ["runtime", "tct"])
def test_bench_overrides_are_refused_where_no_run_takes_them(suite, capsys):
    from distfl.cli import main

    assert main(["bench", "--suite", suite, "train.lr=0.05"]) != 0
    assert "train.lr=0.05" in capsys.readouterr().err


def test_whole_run_suite_times_each_run_and_projects_a_shortened_one(tmp_path, monkeypatch):
    """`--suite whole-run --rounds 3`: both runs (shrunken here) as `distfl train` processes; training
    seconds = the rounds' round_s; a shortened run projected to its whole length at its per-round rate."""
    import copy

    import distfl.bench
    import distfl.bench.whole_run as whole

    runs = copy.deepcopy(whole.RUNS)
    runs["cifar10"]["overrides"] = _shrink(runs["cifar10"]["overrides"])
    runs["quickstart"]["overrides"] += ["partition.num_clients=20", "train.clients_per_round=2", "eval.every=2"]
    monkeypatch.setattr(whole, "RUNS", runs)
    out = tmp_path / "whole-run.json"
    args = argparse.Namespace(out=str(out), rounds=3, repeats=1, quick=False, suite="whole-run", overrides=[])
    assert distfl.bench.main(args) == 0
    res = json.loads(out.read_text())
    for name, cohort, full in (("cifar10", 10, 1500), ("quickstart", 2, 100)):
        r = res["runs"][name]
        assert (r["rounds"], r["full_rounds"], r["world_size"]) == (3, full, 1) and len(r["round_s"]) == 3
        assert r["training_s"] == sum(r["round_s"]) and r["first_round_s"] == r["round_s"][0]
        assert r["client_updates"] == 3 * cohort and r["client_updates_per_s"] == 3 * cohort / r["training_s"]
        assert r["full_run_training_s"] == r["round_s"][0] + sum(r["round_s"][1:]) / 2 * (full - 1)
        assert r["final_test_acc"] is not None
    quick = res["runs"]["quickstart"]
    assert quick["met"] == (quick["full_run_training_s"] <= 10.0)
    cifar = res["runs"]["cifar10"]
    assert cifar["met"] == (10 * 1500 / cifar["full_run_training_s"] >= 1000.0)
    assert "| quickstart | 3 of 100 |" in out.with_suffix(".md").read_text()


@pytest.mark.skipif(importlib.util.find_spec("pfl") is None, reason="pfl-research 0.6 is not installed here")
def test_pfl_research_runs_in_several_worker_processes(tmp_path):
    """bench/pfl_research_cross_device.py --processes 2: two pfl workers (PFL_WORKER_ADDRESSES), and pfl's
    own distributed context counts both."""
    script = Path(__file__).resolve().parents[2] / "bench" / "pfl_research_cross_device.py"
    proc = subprocess.run([sys.executable, str(script), "--rounds", "1", "--processes", "2", "--users", "20",
                           "--cohort", "4"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (res["processes"], res["processes_started"], res["backend"]) == (2, 2, "gloo")
    assert (res["users"], res["cohort"]) == (20, 4)


@pytest.mark.parametrize("sizes", ["2,10", "1,0", "1,1", "1,x", ""])
def test_cross_device_pack_sizes_are_checked_before_any_work(sizes, capsys):
    from distfl.cli import main

    assert main(["bench", "--suite", "cross-device", "--pack-sizes", sizes]) != 0
    assert "--pack-sizes" in capsys.readouterr().err


def test_tct_bench_counts_the_multiply_adds_of_the_papers_network():
    """The features bench's arithmetic row rests on this count: tct_cnn on one 28 x 28 image, layer by
    layer from its documented shapes (5x5 convs keep the size, 2x2 pools halve it)."""
    from distfl.bench.tct import _layer_macs

    model = build_model(ModelConfig(name="tct_cnn"), (1, 28, 28), 10)
    conv1 = 28 * 28 * 32 * (1 * 5 * 5)
    conv2 = 14 * 14 * 64 * (32 * 5 * 5)
    fc1, head = 128 * (64 * 7 * 7), 10 * 128
    assert _layer_macs(model, torch.zeros(1, 1, 28, 28)) == (conv1 + conv2 + fc1 + head, conv1)


def test_startup_suite_times_every_step_of_a_two_rank_run(tmp_path):
    """`--suite startup --quick`: both variants timed under torchrun, every step of rank 0 recorded, the
    table written. (Which variant is faster is the bench's to say, never a test's.)"""
    import distfl.bench
    from distfl.bench.startup import ORDER, VARIANTS

    out = tmp_path / "startup.json"
    args = argparse.Namespace(out=str(out), rounds=2, repeats=1, quick=True, suite="startup")
    assert distfl.bench.main(args) == 0
    res = json.loads(out.read_text())
    for variant in VARIANTS:
        steps = res["median_s"][variant]
        assert set(ORDER) <= set(steps), set(ORDER) - set(steps)
        assert all(v >= 0 for v in steps.values())
        assert steps["whole command (outside)"] > steps["process (from the probe's first line)"] > steps["training rounds"]
    assert "| import torch |" in out.with_suffix(".md").read_text()


@pytest.mark.skipif(not _fmnist_available(), reason="the bench runs on real Fashion-MNIST, not installed here")
def test_tct_bench_on_cuda_computes_in_float32_as_a_run_does(monkeypatch):
    """With torch's default TF32 convolutions, the GPU features bench compared two feature methods
    1.5e-1 apart (bench/tf32_emulation.py shows TF32 rounding moves the features that far); a run turns
    TF32 off. The bench must set the run's numerics before it computes anything on the GPU."""
    from distfl.bench import tct

    torch_defaults = ((torch.backends.cudnn, "allow_tf32", True), (torch.backends.cuda.matmul, "allow_tf32", True),
                      (torch.backends.cudnn, "deterministic", False), (torch.backends.cudnn, "benchmark", True))
    before = [getattr(flags, name) for flags, name, _ in torch_defaults]
    for flags, name, value in torch_defaults:
        setattr(flags, name, value)
    seen = {}

    class Stop(Exception):
        pass

    def features_bench(*args, **kwargs):
        seen.update(conv_tf32=torch.backends.cudnn.allow_tf32, matmul_tf32=torch.backends.cuda.matmul.allow_tf32,
                    deterministic=torch.backends.cudnn.deterministic, benchmark=torch.backends.cudnn.benchmark)
        raise Stop

    monkeypatch.setattr(tct, "_bench_features", features_bench)
    try:
        with pytest.raises(Stop):
            tct.bench(1, lambda *a: None, device="cuda")
    finally:
        for (flags, name, _), value in zip(torch_defaults, before):
            setattr(flags, name, value)
    assert seen == {"conv_tf32": False, "matmul_tf32": False, "deterministic": True, "benchmark": False}


def test_pfl_workers_get_gloo_even_where_pfl_asks_for_nccl(monkeypatch):
    """pfl 0.6 calls init_process_group(backend='nccl', ...) on CUDA, which refuses two workers on one GPU
    ("Duplicate GPU detected", seen on an H200): the bench's workers must start gloo whatever pfl passes."""
    import importlib.util

    import torch.distributed
    path = Path(__file__).resolve().parents[2] / "bench" / "pfl_research_cross_device.py"
    spec = importlib.util.spec_from_file_location("pfl_bench_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    calls = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: calls.append((a, k)))
    assert script.use_backend("gloo") == "gloo"
    torch.distributed.init_process_group(backend="nccl", init_method="tcp://127.0.0.1:1", rank=1, world_size=2)
    assert calls == [(("gloo",), {"init_method": "tcp://127.0.0.1:1", "rank": 1, "world_size": 2})]


def test_the_step_probes_unfold_convolution_is_a_convolution(monkeypatch):
    """bench/cuda_step.py's candidate for the packs' convolutions computes F.conv2d's values and
    gradients under vmap, and gives F.conv2d back afterwards."""
    import torch.nn.functional as F
    from torch.func import functional_call, grad, vmap

    from distfl.models.pfl_cnn import build_pfl_cnn
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import cuda_step
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(4, 3, 9, 11, generator=gen), torch.randn(5, 3, 3, 3, generator=gen), torch.randn(5, generator=gen)
    for kwargs in [{}, {"padding": 1}, {"stride": 2}, {"dilation": 2, "padding": 2}]:
        torch.testing.assert_close(cuda_step.unfold_conv2d(x, w, b, **kwargs), F.conv2d(x, w, b, **kwargs),
                                   rtol=1e-5, atol=1e-5)
    model = build_pfl_cnn((3, 16, 16), 10)
    names = [n for n, _ in model.named_parameters()]
    stacked = [p.detach().unsqueeze(0).repeat(3, *([1] * p.dim())) for p in model.parameters()]
    xs, ys = torch.randn(3, 4, 3, 16, 16, generator=gen), torch.randint(0, 10, (3, 4), generator=gen)

    def loss(params, xb, yb):
        return F.cross_entropy(functional_call(model, dict(zip(names, params)), (xb,)), yb)
    cudnn = vmap(grad(loss))(stacked, xs, ys)
    with cuda_step.convolutions("unfold"):
        assert F.conv2d is cuda_step.unfold_conv2d
        unfolded = vmap(grad(loss))(stacked, xs, ys)
    assert F.conv2d is cuda_step.CONV2D
    for a, c in zip(cudnn, unfolded):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)


def test_privacy_suite_records_the_seconds_per_million_noise_draws(tmp_path, capsys):
    """`distfl bench --suite privacy --quick`: the seconds to draw 10^6 secret and keyed normals and a
    secret cohort, recorded in the JSON and printed in the table."""
    from distfl.cli import main

    out = tmp_path / "privacy.json"
    assert main(["bench", "--suite", "privacy", "--quick", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    for name in ("secret_normal_s", "keystream_s", "keyed_normal_s", "secret_cohort_s", "keyed_cohort_s"):
        assert len(res[name]) == 1 and res[f"{name}_median"] > 0
    assert res["numel"] == 1_000_000 and res["bench"] == "distfl bench --suite privacy"
    printed = capsys.readouterr().out
    assert "secret noise: 10^6 normals" in printed and printed.count("|") > 20
    assert out.with_suffix(".md").read_text() in printed


def test_compression_suite_times_every_compressor(tmp_path):
    """`--suite compression`: a median per compressor per million parameters, with the copy floor."""
    from distfl.compression import COMPRESSORS

    out = tmp_path / "compression.json"
    args = argparse.Namespace(out=str(out), rounds=None, repeats=1, quick=True, suite="compression", overrides=[])
    import distfl.bench

    assert distfl.bench.main(args) == 0
    res = json.loads(out.read_text())
    medians = res["median_s_per_million"]
    assert res["numel"] == 10**6 and "copy (floor)" in medians
    assert all(any(name.split()[0] == compressor for name in medians) for compressor in COMPRESSORS if compressor != "fp16")
    assert all(s > 0 for s in medians.values()) and out.with_suffix(".md").exists()


def test_lora_suite_counts_the_tensors_of_a_packed_round():
    """`--suite lora`'s measurement of one configuration (in this process, on a smaller MLP): LoRA trains
    and counts only the adapters, per client of a pack, beside the one copy of the model."""
    pytest.importorskip("peft")
    from distfl.bench.lora import measure

    small = ["model.mlp_hidden=32", "data.synthetic_train=400", "partition.num_clients=20", "train.clients_per_round=4"]
    full = measure([*small, "runtime.pack_size=2"], 1)
    lora = measure([*small, "runtime.pack_size=2", "model.lora_rank=4", "model.lora_aggregate=stack"], 1)
    assert full["trained_parameters"] == 784 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10
    assert lora["trained_parameters"] == 4 * (784 + 32) + 4 * (32 + 32) + 4 * (32 + 10)
    for res in (full, lora):
        t = res["tensors"]
        assert res["pack_size"] == 2 and len(res["round_s"]) == 1
        assert t["trained_per_client"] == t["gradients_per_client"] == t["momentum_per_client"] \
            == 4 * res["trained_parameters"]
        assert res["tracked_tensor_bytes"] == t["model_parameters"] + t["round_sum_buffer"] + 2 * 3 * t["trained_per_client"]
    assert lora["tensors"]["model_parameters"] == full["tensors"]["model_parameters"] + 4 * lora["trained_parameters"]
