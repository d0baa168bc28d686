"""TCT as a run: stage 1, eNTK features, normalisation, stage 2, across ranks and through a crash."""
from __future__ import annotations

import collections
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import build_trainer, env_with_sitecustomize, metrics, one_and_two, run_cli, summary, train_ok, write_config
from distfl.algorithms import tct as tct_module
from distfl.tct import resources as tct_resources
from distfl.algorithms.tct import MODEL_FILE, TCTPhase
from distfl.checkpoint import complete_checkpoints, load

TCT = {"p": 500, "rounds": 6, "local_steps": 50, "lr": 1e-3}


def tct_config(tmp_path: Path, **tct) -> Path:
    return write_config(tmp_path / "tct.yaml", algorithm={"name": "tct"}, tct={**TCT, **tct},
                        eval={"every": 2}, checkpoint={"every": 2, "keep": 10})


def psi(run_dir: Path) -> torch.Tensor:
    return torch.load(run_dir / MODEL_FILE)["psi"]


def test_tct_learns_and_one_rank_equals_two_ranks(tmp_path):
    config = tct_config(tmp_path)
    one, two = one_and_two(config, tmp_path)
    t1, t2 = one["phases"]["tct"], two["phases"]["tct"]
    assert t1["psi_sha256"] == t2["psi_sha256"] and one["final_test_acc"] == two["final_test_acc"]
    assert one["final_test_acc"] == t1["test_acc"] > t1["stage1_test_acc"] + 0.2  # 26.4% -> 77.2%
    # lambda_max (the divergence advice's bound) is over every client, not only rank 0's.
    assert t1["lambda_max"] == t2["lambda_max"] > 0
    calls = two["collectives"]["calls"]
    assert calls["tct_normalise"] == 1 and calls["tct_lambda_max"] == 1 and calls["tct_round"] == TCT["rounds"]
    assert [r["stage2_round"] for r in metrics(tmp_path / "two") if r.get("phase") == "tct"] == list(range(1, 7))


def test_phase_threads_keep_one_rank_equal_two_ranks_and_the_log_says_what_stage2_does(tmp_path):
    """tct.threads=2 (features and decompositions on 2 threads, the rounds on runtime.threads=1): one
    rank and two ranks give the same bits; each decomposition is announced with its size, its thread
    count and a time estimate; torch's thread count is restored after the phase."""
    config = tct_config(tmp_path, threads=2)
    one = train_ok(config, f"output.dir={tmp_path / 'one'}", "checkpoint.every=0", "runtime.client_state=disk")
    assert torch.get_num_threads() == 1
    proc = run_cli(["train", config, f"output.dir={tmp_path / 'two'}", "checkpoint.every=0",
                    "runtime.client_state=disk"], nproc=2)
    assert proc.returncode == 0, proc.stderr
    assert one["phases"]["tct"]["psi_sha256"] == summary(tmp_path / "two")["phases"]["tct"]["psi_sha256"]
    log = proc.stdout + proc.stderr
    announced = re.findall(r"TCT stage 2: eigendecomposing client (\d+)/(\d+) \(client \d+, (\d+) x \3, "
                           r"2 thread\(s\)\), ~[\d.]+ s each, ~\d+ s left", log)
    assert announced and all(i <= k for i, k, _ in announced)
    assert re.search(r"TCT: features of client \d+ \(\d+ samples\) done, \d+s, ~\d+s left \(2 thread\(s\)\)", log)
    # the final line gives stage 2's accuracy and does not call stage 1's best the run's best
    two = summary(tmp_path / "two")
    final = re.search(r"final test accuracy ([\d.]+)% \(after tct; best of the (\d+) training rounds ([\d.]+)% at "
                      r"round (\d+)\)", proc.stdout)
    assert final, proc.stdout
    assert float(final[1]) == round(100 * two["phases"]["tct"]["test_acc"], 2) != float(final[3])
    assert (int(final[2]), float(final[3]), int(final[4])) == \
        (two["rounds"], round(100 * two["best_test_acc"], 2), two["best_round"])


def test_scaffold_controls_sum_to_zero_every_round(tmp_path):
    run = tmp_path / "r"
    train_ok(tct_config(tmp_path, check_invariant=True), f"output.dir={run}")
    rows = [r for r in metrics(run) if r.get("phase") == "tct"]
    state = load(complete_checkpoints(run)[-1], "cpu")
    clients = sorted((complete_checkpoints(run)[-1] / "clients").glob("*.pt"))
    h_max = max(float(torch.load(p)["tct_h"].abs().max()) for p in clients)
    assert state["phases_done"] == ["tct"] and h_max > 1e-3
    # Exact up to the 2^-40 rounding of each weighted term.
    assert all(r["h_weighted_sum_max"] <= 1e-9 * h_max for r in rows)


def test_closed_form_stage2_equals_iterative(tmp_path):
    closed = train_ok(tct_config(tmp_path, rounds=3), f"output.dir={tmp_path / 'closed'}")
    loop = train_ok(tct_config(tmp_path, rounds=3, local_solver="iterative"), f"output.dir={tmp_path / 'loop'}")
    a, b = psi(tmp_path / "closed"), psi(tmp_path / "loop")
    # The two local solvers agree to ~1e-14 relative in float64; each client's model is then rounded to
    # 2^-40 before the exact sum, which can differ by one unit per client and round at a rounding boundary.
    assert float((a - b).abs().max()) <= 3 * 12 * 2.0**-40 and float(b.abs().max()) > 1e-2  # 3 rounds, 12 clients
    assert closed["final_test_acc"] == loop["final_test_acc"]


def crash_in_stage2_round_5(monkeypatch, *args) -> None:
    """`distfl train *args` in this process, crashing at the start of stage-2 round 5 (after round 4's
    checkpoint)."""
    original = TCTPhase._round

    def crash_in_round_5(self, trainer, solvers, psi_, t, *rest):
        if t == 5:
            raise RuntimeError("simulated crash in stage 2")
        return original(self, trainer, solvers, psi_, t, *rest)

    monkeypatch.setattr(TCTPhase, "_round", crash_in_round_5)
    crashed = run_cli(["train", *args])  # one line, exit 1 (faults.py)
    assert crashed.returncode == 1 and "simulated crash" in crashed.stderr
    monkeypatch.undo()


def test_resume_inside_stage2_equals_running_through(tmp_path, monkeypatch):
    config = tct_config(tmp_path)
    through = train_ok(config, f"output.dir={tmp_path / 'through'}")
    crash_in_stage2_round_5(monkeypatch, config, f"output.dir={tmp_path / 'crashed'}")
    assert complete_checkpoints(tmp_path / "crashed")[-1].name == "tct_000010"  # 6 rounds + stage-2 round 4
    proc = run_cli(["train", "--resume", tmp_path / "crashed"], nproc=2)  # and on another world size
    assert proc.returncode == 0, proc.stderr
    assert "resuming stage 2 at round 5" in proc.stderr
    resumed = summary(tmp_path / "crashed")
    assert resumed["phases"]["tct"]["psi_sha256"] == through["phases"]["tct"]["psi_sha256"]
    assert resumed["collectives"]["calls"].get("round_stats", 0) == 0  # stage 1 not rerun
    assert resumed["collectives"]["calls"]["tct_round"] == 2
    rows = [r["round"] for r in metrics(tmp_path / "crashed")]
    assert rows == list(range(1, 13))


def test_coordinate_order_changes_only_the_order_of_the_stage2_model(tmp_path):
    """tct.coordinate_order: parameter (the default: faster features) and drawn (the released code's)
    keep the same coordinates; normalisation is per coordinate and stage 2 starts from zero, so the
    stage-2 model is the same up to that permutation of its rows (float round-off: the kernel's sums
    run in another order) and so are its predictions."""
    config = tct_config(tmp_path)
    by_parameter = train_ok(config, f"output.dir={tmp_path / 'parameter'}")
    drawn = train_ok(config, f"output.dir={tmp_path / 'drawn'}", "tct.coordinate_order=drawn")
    a, b = (torch.load(tmp_path / name / MODEL_FILE) for name in ("parameter", "drawn"))
    assert not torch.equal(a["coordinates"], b["coordinates"])
    order = b["coordinates"].argsort()  # drawn position of each coordinate in parameter order
    assert torch.equal(a["coordinates"], b["coordinates"][order])
    for key in ("mean", "std"):
        assert torch.allclose(a[key], b[key][order], rtol=1e-12, atol=1e-15)
    weights, bias = a["psi"][:-1], a["psi"][-1]
    assert torch.allclose(weights, b["psi"][:-1][order], rtol=1e-8, atol=1e-12 * weights.abs().max())
    assert torch.allclose(bias, b["psi"][-1], rtol=1e-8, atol=1e-12)
    assert by_parameter["final_test_acc"] == drawn["final_test_acc"]


def test_a_stage2_checkpoint_from_before_coordinate_order_resumes_only_in_drawn_order(tmp_path, monkeypatch):
    """A run checkpointed inside stage 2 by a distfl without tct.coordinate_order used drawn order; its
    model's rows are in that order, so resuming it in parameter order is refused, and a plain resume reads
    the missing key as drawn (its previous default) and finishes as a drawn run from the start does."""
    import hashlib
    import json

    config = tct_config(tmp_path)
    through = train_ok(config, f"output.dir={tmp_path / 'through'}", "tct.coordinate_order=drawn")
    crash_in_stage2_round_5(monkeypatch, config, f"output.dir={tmp_path / 'old'}", "tct.coordinate_order=drawn")
    saved = tmp_path / "old" / "config.yaml"  # as an older distfl wrote them: no such key
    saved.write_text("".join(line for line in saved.read_text().splitlines(True) if "coordinate_order" not in line))
    for path in complete_checkpoints(tmp_path / "old"):
        state = torch.load(path / "state.pt", weights_only=False)
        del state["config"]["tct"]["coordinate_order"]
        torch.save(state, path / "state.pt")
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["files"]["state.pt"] = hashlib.sha256((path / "state.pt").read_bytes()).hexdigest()
        (path / "manifest.json").write_text(json.dumps(manifest))
    proc = run_cli(["train", "--resume", tmp_path / "old", "tct.coordinate_order=parameter"])
    assert proc.returncode == 2 and "tct.coordinate_order cannot change now" in proc.stderr
    proc = run_cli(["train", "--resume", tmp_path / "old"])  # a saved config without the key ran drawn
    assert proc.returncode == 0, proc.stderr
    assert "resuming stage 2 at round 5" in proc.stderr
    assert summary(tmp_path / "old")["phases"]["tct"]["psi_sha256"] == through["phases"]["tct"]["psi_sha256"]


def test_disk_features_float16_and_ablations_run(tmp_path):
    disk = train_ok(tct_config(tmp_path, feature_store="disk", feature_dtype="float16"),
                    f"output.dir={tmp_path / 'disk'}")
    assert list((tmp_path / "disk" / "tct" / "rank0").glob("client_*.float16"))
    assert disk["final_test_acc"] > disk["phases"]["tct"]["stage1_test_acc"] + 0.2
    for solver, extra in [("fedavg", {}), ("gd", {"lr": 0.01})]:
        out = train_ok(tct_config(tmp_path, solver=solver, **extra), f"output.dir={tmp_path / solver}")
        assert out["phases"]["tct"]["solver"] == solver and out["final_test_acc"] > 0.3


# Loaded at start-up by rank 1 only: its file system reports 1 MB free.
SMALL_DISK_ON_RANK_1 = """
import os
if os.environ.get("RANK") == "1":
    import collections, shutil
    shutil.disk_usage = lambda path: collections.namedtuple("usage", "total used free")(2**40, 2**40 - 2**20, 2**20)
"""


def test_disk_store_too_big_for_the_disk_is_refused_on_every_rank_before_extraction(tmp_path, monkeypatch):
    """Before extracting, the disk store's bytes (features + decompositions) are compared with the free space:
    when one rank's file system is short, every rank stops with the advice and no feature file is written;
    a resume counts the files already there as space."""
    Usage = collections.namedtuple("Usage", "total used free")
    config = tct_config(tmp_path, feature_store="disk")
    run = tmp_path / "short"
    env = env_with_sitecustomize(tmp_path, SMALL_DISK_ON_RANK_1)
    proc = run_cli(["train", config, f"output.dir={run}"], nproc=2, env=env)
    assert proc.returncode != 0
    # the main rank prints it: its own disk is large, it stops on rank 1's
    refusals = re.findall(r"TCT's disk store needs [\d.]+ GB under .* more than a rank's file system has free "
                          r"\(([\d.]+) GB free on this rank's\)", proc.stderr)
    assert len(refusals) == 1 and float(refusals[0]) > 0.01, proc.stderr
    assert not list((run / "tct").rglob("client_*.float32"))

    # 1 rank: a disk just below what the store writes is refused, just above it trains
    train_ok(config, f"output.dir={tmp_path / 'ok'}")
    store = tmp_path / "ok" / "tct"
    written = sum(f.stat().st_size for f in store.rglob("*") if f.suffix in (".float32", ".pt") and
                  f.name != tct_module.STATS_FILE)
    for free, refused in ((int(0.97 * written), True), (int(1.03 * written), False)):
        monkeypatch.setattr(tct_resources.shutil, "disk_usage", lambda path, free=free: Usage(2**40, 2**40 - free, free))
        proc = run_cli(["train", config, f"output.dir={tmp_path / f'free{free}'}"])
        assert (proc.returncode == 2) == refused, proc.stderr
        assert ("TCT's disk store needs" in proc.stderr and "smaller tct.p" in proc.stderr) == refused
    # a resume counts the run's own files as space
    monkeypatch.setattr(tct_resources.shutil, "disk_usage", lambda path: Usage(2**40, 2**40 - 2**10, 2**10))
    assert tct_resources.disk_shortfall(tmp_path / "ok", written)[0] == 0
    assert tct_resources.disk_shortfall(tmp_path / "new" / "run", written) == (written - 2**10, 2**10)


def test_p_larger_than_the_model_keeps_every_coordinate(tmp_path):
    proc = run_cli(["train", tct_config(tmp_path, p=10**6), f"output.dir={tmp_path / 'r'}"])
    assert proc.returncode == 0, proc.stderr
    assert "is larger than the" in proc.stderr and "all" in proc.stderr
    result = summary(tmp_path / "r")
    assert result["phases"]["tct"]["p"] == result["num_params"]


def test_memory_is_stated_and_refused_with_advice(tmp_path):
    proc = run_cli(["train", tct_config(tmp_path, memory_limit_gb=0.001), f"output.dir={tmp_path / 'r'}"])
    assert proc.returncode == 2
    assert "GB in memory" in proc.stderr and "float16" in proc.stderr and "disk" in proc.stderr \
        and "smaller tct.p" in proc.stderr


def test_bad_input_is_refused(tmp_path):
    config = tct_config(tmp_path)
    for override, message in [("tct.stage1=fedavgg", "did you mean 'fedavg'"),
                              ("tct.lr=0", "tct.lr must be > 0"),
                              ("calibration.method=ffc", "does not apply"),
                              ("model.head=sphere", "use model.head=linear")]:
        proc = run_cli(["train", config, override, f"output.dir={tmp_path / 'x'}"])
        assert proc.returncode == 2 and message in proc.stderr, (override, proc.stderr)
    proc = run_cli(["train", config, "tct.lr=10", f"output.dir={tmp_path / 'big'}"])
    assert proc.returncode == 2 and "TCT stage 2 round 1" in proc.stderr and "lower tct.lr" in proc.stderr
    assert "so a client's local steps diverge" in proc.stderr
    assert summary(tmp_path / "big")["status"] == "diverged"
    # the suggested lr trains
    lr, steps = re.search(r"e\.g\. tct\.lr=(\S+) tct\.local_steps=(\d+)", proc.stderr).groups()
    proc = run_cli(["train", config, f"tct.lr={lr}", f"tct.local_steps={steps}", f"output.dir={tmp_path / 'ok'}"])
    assert proc.returncode == 0, proc.stderr
    assert summary(tmp_path / "ok")["status"] == "completed"


def test_stage2_settings_can_change_before_stage2_starts_not_after(tmp_path):
    """Stage 1 once, stage 2 tried with another eta on a copy: resuming from the last training round's
    checkpoint with new tct.* keys gives the same result as a run with those keys from the start."""
    import shutil

    config = write_config(tmp_path / "tct.yaml", algorithm={"name": "tct"}, tct={**TCT, "rounds": 2},
                          checkpoint={"every": 1, "keep": 1})
    direct = train_ok(config, f"output.dir={tmp_path / 'direct'}", "tct.lr=2e-3")
    base = tmp_path / "base"
    train_ok(config, f"output.dir={base}")
    # keep=1, yet the last training round's checkpoint survives stage 2's checkpoints.
    assert [p.name for p in complete_checkpoints(base)] == ["round_000006", "tct_000009"]
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    for path in complete_checkpoints(copy):
        if not path.name.startswith("round_"):
            shutil.rmtree(path)
    (copy / "checkpoints" / "latest").write_text("round_000006\n")
    proc = run_cli(["train", "--resume", copy, "tct.lr=2e-3"])
    assert proc.returncode == 0, proc.stderr
    assert summary(copy)["phases"]["tct"]["psi_sha256"] == direct["phases"]["tct"]["psi_sha256"]
    proc = run_cli(["train", "--resume", base, "tct.lr=2e-3", "train.rounds=6"])
    assert proc.returncode == 2 and "cannot change now" in proc.stderr


def test_without_normalisation_the_statistics_collective_is_skipped(tmp_path):
    """TCT (woN): raw features, no normalisation round; the paper needs a larger eta there."""
    out = train_ok(tct_config(tmp_path, normalize=False, lr=0.05), f"output.dir={tmp_path / 'won'}")
    assert "tct_normalise" not in out["collectives"]["calls"]
    model = torch.load(tmp_path / "won" / MODEL_FILE)
    assert model["mean"].numel() == 0
    assert out["final_test_acc"] > out["phases"]["tct"]["stage1_test_acc"]


def _crash_in_stage2_round(monkeypatch, round_):
    original = TCTPhase._round

    def crash(self, trainer, solvers, psi_, t, *args):
        if t == round_:
            raise RuntimeError("simulated crash in stage 2")
        return original(self, trainer, solvers, psi_, t, *args)

    monkeypatch.setattr(TCTPhase, "_round", crash)


def test_resume_with_disk_features_normalises_them_once(tmp_path, monkeypatch):
    """The disk store normalises its files in place. Resumed after stage-2 round 4's checkpoint, the run
    reuses them as they are (on main it normalised them a second time: 77% fell to 15% on FMNIST);
    crashed before any stage-2 checkpoint, the statistics kept in RUN_DIR/tct/stats.pt name the ones
    the files were normalised with, so they are reused too. Either way the result is the uninterrupted
    run's, bit for bit."""
    config = tct_config(tmp_path, feature_store="disk")
    through = train_ok(config, f"output.dir={tmp_path / 'through'}")
    memory = train_ok(config, f"output.dir={tmp_path / 'memory'}", "tct.feature_store=memory")
    assert through["phases"]["tct"]["psi_sha256"] == memory["phases"]["tct"]["psi_sha256"]
    for crash_round in (5, 1):
        run = tmp_path / f"crashed_in_{crash_round}"
        _crash_in_stage2_round(monkeypatch, crash_round)
        crashed = run_cli(["train", config, f"output.dir={run}"])  # one line, exit 1 (faults.py)
        assert crashed.returncode == 1 and "simulated crash" in crashed.stderr
        monkeypatch.undo()
        features = run / "tct" / "rank0" / "client_0.float32"
        written = features.stat().st_mtime_ns
        resumed = train_ok(None, resume=str(run))
        assert resumed["phases"]["tct"]["psi_sha256"] == through["phases"]["tct"]["psi_sha256"], crash_round
        assert resumed["final_test_acc"] == through["final_test_acc"]
        assert features.stat().st_mtime_ns == written, crash_round
        assert (run / "tct" / "rank0" / "client_0.complete").read_text().startswith("normalised ")


def test_normalisation_and_centred_targets_match_an_independent_computation(tmp_path):
    """Stage 2 with TCT-GD on 1 rank, recomputed here from Algorithm 3's per-sample gradients of the
    stage-1 model: two-pass float64 mean and population standard deviation over all clients, z-scored
    features (constant coordinates -> 0), targets one-hot - 1/C, and R full-batch gradient steps on
    (1/(2n)) ||[Z, 1] psi - Y||^2 from psi = 0."""
    from distfl.federation.local import FlatModel
    from distfl.models import build_model
    from distfl.tct.features import entk_features, reinit_head

    f64, lr, rounds = torch.float64, 0.05, 3
    config = tct_config(tmp_path, solver="gd", lr=lr, rounds=rounds, feature_store="disk")
    run = tmp_path / "gd"
    train_ok(config, f"output.dir={run}")
    saved = torch.load(run / MODEL_FILE)

    trainer = build_trainer(config, tmp_path / "data")
    data = trainer.data
    stage1 = load(next(p for p in complete_checkpoints(run) if p.name == "round_000006"), "cpu")
    assert not stage1["phases_done"]
    flat = FlatModel(build_model(trainer.cfg.model, data.input_shape, data.num_classes))
    flat.load(stage1["params"], stage1["buffers"])
    reinit_head(flat.module, trainer.cfg.tct.head_seed)
    clients = range(len(trainer.population))
    tc = trainer.cfg.tct
    raw = [entk_features(flat.module, data.train_x[trainer.client_indices[k]], saved["coordinates"], tc.gradient_of,
                         tc.chunk_size).to(f64) for k in clients]
    everything = torch.cat(raw)
    mean = everything.mean(0)
    std = (everything - mean).pow(2).mean(0).sqrt()
    varying = std > 1e-6 * std.max()
    assert 0 < int(varying.sum()) < len(std)  # some coordinates are constant (the other logits' head rows)
    assert torch.allclose(saved["mean"], mean, rtol=1e-12, atol=1e-18)
    assert torch.allclose(saved["std"][varying], std[varying], rtol=1e-10, atol=0)
    assert torch.isinf(saved["std"][~varying]).all()

    # What float32 storage keeps of the z-scores (the solver computes in float64 from it).
    def z_score(z):
        return torch.where(varying, (z - mean) / std, torch.zeros_like(z)).float().to(f64)

    def stored(name):  # what stage 2 trained and evaluated on: the disk store's files
        return torch.from_numpy(np.fromfile(run / "tct" / "rank0" / f"{name}.float32", np.float32)).view(-1, len(mean))

    normalised = [z_score(z) for z in raw]
    test_z = z_score(entk_features(flat.module, data.test_x, saved["coordinates"], tc.gradient_of, tc.chunk_size))
    for name, expected in [*((f"client_{k}", normalised[k]) for k in clients), ("test", test_z)]:
        assert torch.allclose(stored(name).to(f64), expected, rtol=2.4e-7, atol=1e-9), name  # 2 ulp

    c = data.num_classes
    Z = torch.cat([torch.cat(normalised), torch.ones(len(everything), 1, dtype=f64)], 1)
    Y = torch.cat([torch.eye(c, dtype=f64)[data.train_y[trainer.client_indices[k]]] for k in clients]) - 1.0 / c
    psi_ = torch.zeros(Z.shape[1], c, dtype=f64)
    for _ in range(rounds):
        psi_ = psi_ - lr * Z.T @ (Z @ psi_ - Y) / len(Z)
    # Each client's weighted model is rounded to 2^-40 before the exact sum: R K 2^-41, twice for slack.
    assert float((saved["psi"] - psi_).abs().max()) <= rounds * len(clients) * 2.0**-40
    uncentred = torch.zeros_like(psi_)
    for _ in range(rounds):
        uncentred = uncentred - lr * Z.T @ (Z @ uncentred - (Y + 1.0 / c)) / len(Z)
    assert float((uncentred - psi_).norm() / psi_.norm()) > 1e-2


def _feature_files(run: Path) -> dict:
    """(inode, mtime) of every disk feature file of a run: unchanged when a file was not rewritten."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted((run / "tct").glob("rank*/*.float32"))}


def _diverged_in_round_1(tmp_path: Path, config: Path) -> Path:
    """A disk-store run whose stage 2 diverges in round 1 (tct.lr far too large), after its features,
    statistics and decompositions were computed."""
    run = tmp_path / "diverged"
    proc = run_cli(["train", config, "tct.lr=10", f"output.dir={run}"])
    assert proc.returncode == 2 and "TCT stage 2 round 1" in proc.stderr, proc.stderr
    assert complete_checkpoints(run)[-1].name == "round_000006"  # no stage-2 checkpoint
    return run


def test_a_diverged_stage2_resumed_with_a_stable_lr_reuses_features_and_decompositions(tmp_path):
    """Stage 2 fails in round 1; resumed from the last stage-1 checkpoint with a stable tct.lr, it
    reuses the features (not rewritten), their statistics and every client's decomposition, and equals
    a run with that tct.lr from the start on 2 ranks, bit for bit."""
    config = tct_config(tmp_path, feature_store="disk", rounds=2)
    fresh = train_ok(config, f"output.dir={tmp_path / 'fresh'}", nproc=2)
    run = _diverged_in_round_1(tmp_path, config)
    files = _feature_files(run)
    assert (run / "tct" / "stats.pt").exists() and len(files) == 13  # 12 clients and the test set
    proc = run_cli(["train", "--resume", run, f"tct.lr={TCT['lr']}"])
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr
    assert "TCT: normalisation statistics reused from" in log and "extracted again" not in log
    assert sorted(int(k) for k in re.findall(r"decomposition of client (\d+) reused", log)) == list(range(12))
    assert "eigendecomposing" not in log and "tct_normalise" not in summary(run)["collectives"]["calls"]
    assert _feature_files(run) == files
    resumed = summary(run)
    assert resumed["phases"]["tct"]["psi_sha256"] == fresh["phases"]["tct"]["psi_sha256"]
    assert resumed["final_test_acc"] == fresh["final_test_acc"] > resumed["phases"]["tct"]["stage1_test_acc"]


def test_a_resume_with_broken_or_foreign_stats_and_decompositions_recomputes_them(tmp_path):
    """Whatever is wrong with a kept file, the resumed run says so, recomputes what it cannot trust and
    still equals the run with the stable tct.lr from the start: statistics unreadable or of other
    features (then the features, normalised in place, are extracted again), a decomposition file
    truncated or saved under another key (only that client is eigendecomposed again)."""
    import shutil

    config = tct_config(tmp_path, feature_store="disk", rounds=2)
    fresh = train_ok(config, f"output.dir={tmp_path / 'fresh'}")
    diverged = _diverged_in_round_1(tmp_path, config)
    for damage, said in [("truncate", "unreadable"), ("other_source", "they are of other features")]:
        run = tmp_path / damage
        shutil.copytree(diverged, run)
        stats, folder = run / "tct" / "stats.pt", run / "tct" / "rank0"
        if damage == "truncate":
            stats.write_bytes(stats.read_bytes()[:100])
        else:
            saved = torch.load(stats)
            torch.save({**saved, "source": "0" * 16}, stats)
        (folder / "client_3.decomposition.pt").write_bytes(b"not a decomposition")
        saved = torch.load(folder / "client_5.decomposition.pt")
        torch.save({**saved, "key": "0" * 16}, folder / "client_5.decomposition.pt")
        files = _feature_files(run)
        proc = run_cli(["train", "--resume", run, f"tct.lr={TCT['lr']}"])
        assert proc.returncode == 0, proc.stderr
        log = proc.stderr
        assert f"normalisation statistics in {stats} not reused ({said}" in log, log
        assert "decomposition of client 3 recomputed: its file is unusable" in log
        assert "decomposition of client 5 recomputed: its file is of another key" in log
        reused = sorted(int(k) for k in re.findall(r"decomposition of client (\d+) reused", log))
        assert reused == [k for k in range(12) if k not in (3, 5)], damage
        assert re.findall(r"eigendecomposing client \d+/2 \(client (\d+),", log) == ["3", "5"]
        # normalised with statistics that cannot be vouched for: every file extracted again
        assert all(files[name] != new for name, new in _feature_files(run).items())
        assert len(re.findall(r"TCT: features \S+ extracted again", log)) == 13
        resumed = summary(run)
        assert resumed["phases"]["tct"]["psi_sha256"] == fresh["phases"]["tct"]["psi_sha256"], damage
        assert resumed["final_test_acc"] == fresh["final_test_acc"], damage
