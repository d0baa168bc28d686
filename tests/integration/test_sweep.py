"""`distfl sweep` without Slurm: run-directory naming, the `sweep:` block, the local executor (skip what
finished, resume what did not, torchrun ranks), and bad input refused before anything is written."""
from __future__ import annotations

import json

import pytest
import yaml

from conftest import SMALL, metrics, run_cli, slow_first_round, summary, train_ok, wait_for_marks, write_config
from distfl.config import load_config, load_sweep_block
from distfl.sweep import build_sweep, parse_seeds


def _no_traceback(proc):
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


def test_run_directories_are_named_after_the_overrides(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")})
    sweep = build_sweep(str(cfg), grid_args=["partition.alpha=0.1,0.5", "algorithm.name=fedavg,scaffold"],
                        seeds_arg="0,1")
    names = [p.name for p in sweep.points]
    assert names[0] == "algorithm.name=fedavg,partition.alpha=0.1/seed=0"
    assert len(names) == 8 and len(set(names)) == 8
    assert "algorithm.name=scaffold,partition.alpha=0.5/seed=1" in names
    point = sweep.points[-1]
    assert point.run_dir == (tmp_path / "sw" / point.name).resolve()
    assert point.config["algorithm"]["name"] == "scaffold" and point.config["partition"]["alpha"] == 0.5
    assert point.config["seed"] == 1 and point.config["output"]["dir"] == str(point.run_dir)
    # Characters other than letters, digits and ._+- become "_"; no seed list: the config's seed.
    odd = build_sweep(str(cfg), grid_args=["data.root=/data/a b"])
    assert [p.name for p in odd.points] == [f"data.root=_data_a_b/seed={SMALL['seed']}"]
    assert not (tmp_path / "sw").exists()  # building a sweep writes nothing
    assert parse_seeds("0-2,5") == [0, 1, 2, 5]


def test_sweep_block_is_used_by_sweep_and_ignored_by_train(tmp_path):
    block = {"grid": {"algorithm": {"name": ["fedavg", "fedprox"]}, "train.lr": [0.1]}, "seeds": [4, 5],
             "executor": "local", "slurm": {"partition": "gpu", "time": "01:30:00"}}
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")}, sweep=block)
    assert load_sweep_block(str(cfg)) == block
    assert load_config(str(cfg)).seed == SMALL["seed"]
    sweep = build_sweep(str(cfg))
    assert sweep.grid == {"algorithm.name": ["fedavg", "fedprox"], "train.lr": ["0.1"]}
    assert sweep.seeds == [4, 5] and sweep.slurm["partition"] == "gpu" and sweep.slurm["time"] == 90
    assert [p.name for p in sweep.points][:2] == ["algorithm.name=fedavg,train.lr=0.1/seed=4",
                                                  "algorithm.name=fedavg,train.lr=0.1/seed=5"]
    # The command line wins: --grid replaces that key, --seeds the list.
    sweep = build_sweep(str(cfg), grid_args=["algorithm.name=scaffold"], seeds_arg="7")
    assert [p.name for p in sweep.points] == ["algorithm.name=scaffold,train.lr=0.1/seed=7"]
    # `distfl train` on the same file trains the base config and ignores the block.
    s = train_ok(cfg, f"output.dir={tmp_path / 'plain'}")
    assert s["status"] == "completed"
    assert "sweep" not in yaml.safe_load((tmp_path / "plain" / "config.yaml").read_text())


def test_local_sweep_skips_finished_points_and_resumes_unfinished_ones(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")})
    grid = ["--grid", "algorithm.name=fedavg,scaffold"]
    # A sweep that "crashed": one point ran only 2 of its 6 rounds (checkpoint at round 2), one has
    # output but no checkpoint (a crash in round 1), the scaffold point finished.
    point = tmp_path / "sw" / f"algorithm.name=fedavg/seed={SMALL['seed']}"
    train_ok(cfg, f"output.dir={point}", "train.rounds=2")
    done = train_ok(cfg, f"output.dir={tmp_path / 'sw' / 'algorithm.name=scaffold' / 'seed=3'}",
                    "algorithm.name=scaffold")
    mtime = (tmp_path / "sw" / "algorithm.name=scaffold" / "seed=3" / "summary.json").stat().st_mtime_ns

    proc = run_cli(["sweep", cfg, *grid])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 already finished; running 1" in proc.stdout and "resuming algorithm.name=fedavg" in proc.stdout
    resumed = summary(point)
    assert resumed["status"] == "completed"
    assert resumed["model_sha256"] == train_ok(cfg, f"output.dir={tmp_path / 'through'}")["model_sha256"]
    assert [r["round"] for r in metrics(point)] == list(range(1, 7))
    assert (tmp_path / "sw" / "algorithm.name=scaffold" / "seed=3" / "summary.json").stat().st_mtime_ns == mtime
    assert summary(tmp_path / "sw" / "algorithm.name=scaffold" / "seed=3") == done
    record = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert record["swept_keys"] == ["algorithm.name"] and len(record["points"]) == 2

    # Everything finished: nothing runs.
    proc = run_cli(["sweep", cfg, *grid])
    assert proc.returncode == 0 and "2 already finished; running 0" in proc.stdout

    # Output but no checkpoint: started over (--overwrite), not refused.
    partial = tmp_path / "sw" / "algorithm.name=fedprox" / "seed=3"
    partial.mkdir(parents=True)
    (partial / "metrics.jsonl").write_text('{"round": 1, "train_loss": 9.0}\n')
    proc = run_cli(["sweep", cfg, "--grid", "algorithm.name=fedprox"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(partial)["status"] == "completed" and len(metrics(partial)) == 6


def test_local_sweep_with_torchrun_ranks(tmp_path):
    """--nproc 2: each point under torchrun; same model as one rank in this process."""
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")})
    proc = run_cli(["sweep", cfg, "--nproc", "2", "--seeds", "5"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    two = summary(tmp_path / "sw" / "seed=5")
    assert two["world_size"] == 2
    assert two["model_sha256"] == train_ok(cfg, f"output.dir={tmp_path / 'one'}", "seed=5")["model_sha256"]


@pytest.mark.parametrize("nproc", [1, 2])
def test_stopping_a_local_sweep_checkpoints_a_round_longer_than_30s(tmp_path, nproc):
    """SIGTERM to a sweep with 40 s of round 1 left: the run checkpoints round 1 and the sweep exits 3;
    run again, it resumes at round 2 and ends with the one-rank model. One rank trains in the sweep's
    own process; `--nproc 2` ranks are signalled directly, not through torchrun's agent, which kills
    them 30 s after a SIGTERM."""
    import signal
    import subprocess
    import sys

    cfg = write_config(tmp_path / "c.yaml", train={"rounds": 2}, checkpoint={"every": 0}, eval={"every": 2},
                       output={"dir": str(tmp_path / "sw")})
    env, marks = slow_first_round(tmp_path)
    if nproc == 1:
        env["RANK"] = "0"  # the slow round is for ranks only; RANK=0 alone is still a world of one process
    sweep = [sys.executable, "-m", "distfl", "sweep", str(cfg), "--nproc", str(nproc), "--seeds", "5"]
    proc = subprocess.Popen(sweep, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_marks(marks, nproc)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=300)[0]
    run = tmp_path / "sw" / "seed=5"
    assert proc.returncode == 3, out
    assert (run / "checkpoints" / "latest").read_text().strip() == "round_000001", out
    again = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "resuming" in again.stderr, again.stdout + again.stderr
    assert [r["round"] for r in metrics(run)] == [1, 2]
    assert summary(run)["model_sha256"] == train_ok(cfg, f"output.dir={tmp_path / 'one'}", "seed=5")["model_sha256"]


@pytest.mark.parametrize("args,expected", [
    (["--grid", "train.lrr=0.1,0.05"], "'train.lrr' is not a config key; did you mean 'train.lr'?"),
    (["--grid", "partition.alpah=0.1"], "did you mean 'partition.alpha'?"),
    (["--grid", "seed=1,2"], "--seeds"),
    (["--grid", "partition.alpha=0.1,-1"], "sweep point partition.alpha=-1/seed=3: partition.alpha must be > 0"),
    (["--grid", "train.lr=0.1,0.10"], "are the same run"),
    (["--grid", "algorithm.name"], "expected KEY=V1,V2"),
    (["--seeds", "a,b"], "--seeds"),
    (["--slurm", "partitoin=debug", "--executor", "slurm"], "unknown Slurm option 'partitoin'; did you mean 'partition'?"),
    (["--slurm", "time=soon", "--executor", "slurm"], "not a time limit"),
    (["--nproc", "2", "--executor", "slurm"], "--nproc is for --executor local"),
    (["train.rounds=0"], "train.rounds must be >= 1"),
], ids=["grid-key", "grid-key-2", "seed-in-grid", "bad-point", "duplicate-point", "grid-syntax", "seeds",
        "slurm-option", "slurm-time", "nproc-on-slurm", "fixed-override"])
def test_bad_input_is_refused_before_anything_is_written(tmp_path, args, expected):
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")})
    proc = run_cli(["sweep", cfg, *args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    _no_traceback(proc)
    assert not (tmp_path / "sw").exists()


def test_bad_sweep_block_is_refused(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")},
                       sweep={"grid": {"train.lr": [0.1]}, "slurm": {"partitoin": "debug"}})
    proc = run_cli(["sweep", cfg, "--executor", "slurm"])
    assert proc.returncode == 2 and "sweep.slurm in" in proc.stderr and "did you mean 'partition'?" in proc.stderr
    cfg = write_config(tmp_path / "d.yaml", sweep={"grids": {"train.lr": [0.1]}})
    proc = run_cli(["sweep", cfg])
    assert proc.returncode == 2 and "did you mean 'grid'?" in proc.stderr
    _no_traceback(proc)


def test_slurm_executor_without_slurm_is_a_clear_error(tmp_path, monkeypatch):
    """No sbatch on PATH: exit 2 with what to do, before anything is written or submitted."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")})
    proc = run_cli(["sweep", cfg, "--grid", "train.lr=0.1,0.05", "--executor", "slurm"])
    assert proc.returncode == 2
    assert "sbatch" in proc.stderr and "--executor local" in proc.stderr and "dev-cluster.sh" in proc.stderr
    _no_traceback(proc)
    assert not (tmp_path / "sw").exists()


def test_a_directory_holding_another_run_is_refused(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")})
    train_ok(cfg, f"output.dir={tmp_path / 'sw' / 'seed=3'}")
    proc = run_cli(["sweep", cfg, "train.lr=0.2"])
    assert proc.returncode == 2 and "holds a different run: train.lr" in proc.stderr
    _no_traceback(proc)


@pytest.mark.parametrize("given,minutes", [("time=2:00:00", 120), ("time=1:30", 2), ("time=90", 90),
                                            ("time=1-00:00:00", 1440)])
def test_slurm_time_is_read_as_sbatch_reads_it(given, minutes):
    """`--slurm time=2:00:00` is two hours, not YAML 1.1's base-60 integer 7200 (minutes)."""
    from distfl.sweep.slurm import check_slurm_options, parse_slurm_arg

    assert check_slurm_options(parse_slurm_arg(given), "--slurm")["time"] == minutes


def test_slurm_time_in_a_sweep_block_is_read_as_sbatch_reads_it(tmp_path):
    from distfl.config import load_sweep_block
    from distfl.sweep.slurm import check_slurm_options

    path = tmp_path / "c.yaml"
    path.write_text("sweep:\n  slurm:\n    time: 2:00:00\n")
    assert check_slurm_options(load_sweep_block(str(path))["slurm"], "sweep.slurm")["time"] == 120


def test_listed_points_put_fedavg_ft_beside_personalised_methods(tmp_path):
    """--points FILE: one sweep holds FedAvg + fine-tuning (eval.finetune_epochs, which personalised
    methods refuse) beside FedRep and Ditto; each point is the run `distfl train` makes of its overrides,
    the report names the fine-tuned runs by the key that differs, and config warnings are one line."""
    sweep_dir = tmp_path / "sw"
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(sweep_dir)}, eval={"every": 3, "clients": True},
                       algorithm={"mu": 0.1})  # read by fedprox only: a warning for every point
    points = tmp_path / "points.yaml"
    points.write_text("- {algorithm.name: fedavg, eval.finetune_epochs: 1}\n- algorithm: {name: fedrep}\n"
                      "- {algorithm.name: ditto}\n")
    proc = run_cli(["sweep", cfg, "--points", points, "--seeds", "0"], subprocess_=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = ["algorithm.name=fedavg,eval.finetune_epochs=1", "algorithm.name=fedrep", "algorithm.name=ditto"]
    assert [f"running {n}/seed=0" in proc.stdout for n in names] == [True] * 3
    assert "per-client accuracy (eval.clients, each client's model fine-tuned 1 epoch(s) first)" in proc.stdout
    assert "(sweep eta " in proc.stdout
    warning = "distfl: warning: algorithm.mu is set but only used by algorithm.name in [fedprox]; it is ignored for ditto"
    assert proc.stderr.count(warning + "\n") == 1 and "ConfigWarning" not in proc.stderr
    single = train_ok(cfg, "algorithm.name=fedavg", "eval.finetune_epochs=1", "seed=0",
                      f"output.dir={tmp_path / 'single'}")
    got = summary(sweep_dir / names[0] / "seed=0")
    assert got["model_sha256"] == single["model_sha256"] and got["final_client_acc"] == single["final_client_acc"]
    assert json.loads((sweep_dir / "sweep.json").read_text())["listed"][0] == {
        "algorithm.name": "fedavg", "eval.finetune_epochs": "1"}
    proc = run_cli(["report", sweep_dir])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| fedavg | 1 | 1 |" in proc.stdout  # algorithm.name, eval.finetune_epochs, seeds


def test_zipped_keys_and_bad_listed_points(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")})
    sweep = build_sweep(str(cfg), zip_args=["algorithm.name=fedavg,fedprox", "train.lr=0.05,0.1"],
                        grid_args=["partition.alpha=0.1,0.5"], seeds_arg="0")
    assert [p.name for p in sweep.points] == [
        "algorithm.name=fedavg,partition.alpha=0.1,train.lr=0.05/seed=0",
        "algorithm.name=fedavg,partition.alpha=0.5,train.lr=0.05/seed=0",
        "algorithm.name=fedprox,partition.alpha=0.1,train.lr=0.1/seed=0",
        "algorithm.name=fedprox,partition.alpha=0.5,train.lr=0.1/seed=0"]
    points = tmp_path / "p.yaml"
    for text, args, expected in [
        (None, ["--zip", "algorithm.name=fedavg,fedprox", "--zip", "train.lr=0.1"], "as many values each"),
        ("- {train.lrr: 0.1}\n", [], "did you mean 'train.lr'"),
        ("- {train.lr: 0.1}\n", ["--grid", "train.lr=0.1,0.2"], "train.lr is both a grid key and a key of the listed"),
        ("{train.lr: 0.1}\n", [], "expected a non-empty list of points"),
        ("- {algorithm.name: fedavg}\n- {algorithm.name: fedavg}\n", [], "are the same run"),
    ]:
        if text is not None:
            points.write_text(text)
            args = ["--points", points, *args]
        proc = run_cli(["sweep", cfg, *args, "--dry-run"])
        assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr, (text, proc.stderr)
