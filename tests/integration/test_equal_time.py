"""Comparing runs at equal simulated time: train.virtual_time_s stops a synchronous and an asynchronous
run at the first round (server step) past the same budget, and eval.target_acc's time_to_acc is the first
evaluation that reached the target, as metrics.jsonl shows it."""
from __future__ import annotations

from conftest import metrics, run_cli, summary, train_ok, write_config

SPEEDS = ("system.speed=lognormal:0,1", "system.bandwidth=uniform:100,1000")
FEDBUFF = ("system.async_mode=fedbuff", "system.buffer_size=2", "system.concurrency=5")


def test_a_virtual_time_budget_stops_sync_and_fedbuff_at_the_same_simulated_time(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"rounds": 200})
    # The budget: a little past the end of the synchronous run's third round.
    probe = train_ok(cfg, f"output.dir={tmp_path / 'probe'}", *SPEEDS, "train.rounds=3")
    budget = probe["virtual_time_s"] * 1.01
    runs = {"sync": (), "fedbuff": FEDBUFF}
    for name, extra in runs.items():
        s = train_ok(cfg, f"output.dir={tmp_path / name}", *SPEEDS, *extra, f"train.virtual_time_s={budget}")
        rows = metrics(tmp_path / name)
        times = [r["virtual_time_s"] for r in rows]
        # It stopped at the first round whose end reached the budget: every earlier one ended before it.
        assert times[-1] >= budget and all(t < budget for t in times[:-1]), (name, times)
        assert s["status"] == "completed" and s["rounds"] == len(rows) < 200
        assert s["time_budget"] == {"virtual_time_s": budget, "round": len(rows)}
        assert s["virtual_time_s"] == times[-1] and "test_acc" in rows[-1]  # evaluated where it stopped
        runs[name] = (times, rows)
    # Both ended within one of their own steps past the budget.
    for times, _ in runs.values():
        step = times[-1] - (times[-2] if len(times) > 1 else 0.0)
        assert budget <= times[-1] < budget + step + 1e-9
    assert len(runs["fedbuff"][1]) != len(runs["sync"][1])  # equal time, not equal rounds
    # distfl report counts a run that spent its budget as completed.
    proc = run_cli(["report", tmp_path / "sync", tmp_path / "fedbuff", "--out", tmp_path / "r"])
    assert proc.returncode == 0, proc.stderr
    assert "unfinished" not in (tmp_path / "r" / "report.md").read_text()


def test_a_budget_needs_a_system_model(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    proc = run_cli(["train", cfg, f"output.dir={tmp_path / 'run'}", "train.virtual_time_s=100"])
    assert proc.returncode == 2 and "train.virtual_time_s" in proc.stderr and "system" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_time_to_acc_is_the_first_evaluation_that_reached_the_target(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"rounds": 8}, eval={"every": 1})
    plain = train_ok(cfg, f"output.dir={tmp_path / 'plain'}", *SPEEDS)
    accs = [r["test_acc"] for r in metrics(tmp_path / "plain")]
    target = sorted(accs)[len(accs) // 2]  # reached part-way through
    s = train_ok(cfg, f"output.dir={tmp_path / 'run'}", *SPEEDS, f"eval.target_acc={target}")
    assert s["model_sha256"] == plain["model_sha256"]  # a target changes no result
    rows = metrics(tmp_path / "run")
    first = next(r for r in rows if r.get("test_acc") is not None and r["test_acc"] >= target)
    assert s["time_to_acc"] == {"target": target, "metric": "test_acc", "round": first["round"],
                                "virtual_time_s": first["virtual_time_s"], "wall_s": first["wall_s"]}
    # The progress line shows the simulated clock.
    proc = run_cli(["train", cfg, f"output.dir={tmp_path / 'log'}", *SPEEDS, "output.progress=log", "train.rounds=2"])
    assert proc.returncode == 0 and "simulated 0m" in proc.stderr, proc.stderr
    # A target no evaluation reached: None, and the report says in how many runs it was reached.
    s = train_ok(cfg, f"output.dir={tmp_path / 'never'}", *SPEEDS, "eval.target_acc=1.0")
    assert s["time_to_acc"]["round"] is None and s["time_to_acc"]["virtual_time_s"] is None
    proc = run_cli(["report", tmp_path / "run", tmp_path / "never", "--by", "eval.target_acc",
                    "--out", tmp_path / "r"])
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "r" / "report.md").read_text()
    assert "time to target (simulated s, mean ± std)" in md and "not reached in 1 run(s)" in md, md
    assert f"| {first['virtual_time_s']:.4g} |" in md, md
