"""`distfl report`: the table's numbers are the runs' summaries, grouped by the swept keys, and the
plots are written."""
from __future__ import annotations

import csv
import shutil
import statistics

from conftest import run_cli, summary, write_config


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_report_of_a_finished_sweep(tmp_path):
    sweep_dir = tmp_path / "sw"
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(sweep_dir)}, eval={"every": 2})
    proc = run_cli(["sweep", cfg, "--grid", "algorithm.name=fedavg,fedprox", "--seeds", "0,1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr

    proc = run_cli(["report", sweep_dir])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = sweep_dir / "report"
    for name in ("acc_vs_round.png", "acc_vs_time.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    rows = _csv(out / "report.csv")
    assert [r["algorithm.name"] for r in rows] == ["fedavg", "fedprox"]
    for row in rows:
        runs = [summary(sweep_dir / f"algorithm.name={row['algorithm.name']}" / f"seed={s}") for s in (0, 1)]
        final = [r["final_test_acc"] for r in runs]
        best = [r["best_test_acc"] for r in runs]
        assert row["seeds"] == "0,1" and row["completed"] == "2" and row["diverged"] == "0"
        assert float(row["final_acc_mean"]) == statistics.fmean(final)
        assert float(row["final_acc_std"]) == statistics.stdev(final)
        assert float(row["best_acc_mean"]) == statistics.fmean(best)
        assert float(row["best_acc_std"]) == statistics.stdev(best)
        assert int(row["rounds"]) == 6
        # The markdown table shows the same numbers in percent.
        md = f"{100 * statistics.fmean(final):.2f} ± {100 * statistics.stdev(final):.2f}"
        assert md in (out / "report.md").read_text() and md in proc.stdout

    # An unfinished run is listed, not averaged; run directories given one by one (no sweep.json)
    # are grouped by the keys whose values differ.
    unfinished = sweep_dir / "algorithm.name=fedprox" / "seed=1"
    (unfinished / "summary.json").unlink()
    runs = [sweep_dir / "algorithm.name=fedavg" / "seed=0", sweep_dir / "algorithm.name=fedprox" / "seed=0", unfinished]
    # A run from a distfl that predates train.local_steps groups with one that has it at its default.
    saved = runs[1] / "config.yaml"
    text = saved.read_text()
    assert "\n  local_steps: 0\n" in text
    saved.write_text(text.replace("\n  local_steps: 0\n", "\n"))
    proc = run_cli(["report", *runs, "--out", tmp_path / "r2"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["algorithm.name"]: r for r in _csv(tmp_path / "r2" / "report.csv")}
    assert len(rows) == 2 and rows["fedprox"]["runs"] == "2" and rows["fedprox"]["completed"] == "1"
    assert float(rows["fedprox"]["final_acc_mean"]) == summary(runs[1])["final_test_acc"]
    assert rows["fedprox"]["final_acc_std"] == ""  # one run: no standard deviation
    assert f"{unfinished}: unfinished" in (tmp_path / "r2" / "report.md").read_text()

    # A key that differs but that no run reads (here a TCT option in FedAvg runs) does not split them;
    # one that is read and differs (train.lr) does by default, and not when --by names the key that matters.
    import yaml

    fedavg = [sweep_dir / "algorithm.name=fedavg" / f"seed={s}" for s in (0, 1)]
    saved = yaml.safe_load((fedavg[1] / "config.yaml").read_text())
    saved["tct"]["chunk_size"] += 1
    (fedavg[1] / "config.yaml").write_text(yaml.safe_dump(saved))
    proc = run_cli(["report", *fedavg, "--out", tmp_path / "r3"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _csv(tmp_path / "r3" / "report.csv")
    assert [r["runs"] for r in rows] == ["2"] and "tct.chunk_size" not in rows[0]
    saved["train"]["lr"] *= 2
    (fedavg[1] / "config.yaml").write_text(yaml.safe_dump(saved))
    proc = run_cli(["report", *fedavg, "--out", tmp_path / "r3"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["runs"] for r in _csv(tmp_path / "r3" / "report.csv")] == ["1", "1"]
    proc = run_cli(["report", *fedavg, "--out", tmp_path / "r4", "--by", "algorithm.name"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _csv(tmp_path / "r4" / "report.csv")
    assert len(rows) == 1 and rows[0]["runs"] == "2" and rows[0]["seeds"] == "0,1"
    assert float(rows[0]["final_acc_mean"]) == statistics.fmean(summary(r)["final_test_acc"] for r in fedavg)
    # A key the method does not read is "-" and does not split its runs: fedavg ignores algorithm.mu (a flat
    # key of the configs written before method options moved, as this edit writes it).
    saved = yaml.safe_load((fedavg[1] / "config.yaml").read_text())
    saved["algorithm"]["mu"] = 0.5
    (fedavg[1] / "config.yaml").write_text(yaml.safe_dump(saved))
    proc = run_cli(["report", sweep_dir, "--out", tmp_path / "r6", "--by", "algorithm.name,algorithm.mu"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["algorithm.name"]: r for r in _csv(tmp_path / "r6" / "report.csv")}
    mu = yaml.safe_load((sweep_dir / "algorithm.name=fedprox" / "seed=0" / "config.yaml").read_text())["algorithm"]
    mu = mu["options"]["mu"]  # the old name --by algorithm.mu is the option it became, in old and new run configs
    assert rows["fedavg"]["algorithm.options.mu"] == "" and rows["fedavg"]["runs"] == "2"
    assert float(rows["fedprox"]["algorithm.options.mu"]) == mu
    assert "| fedavg | - |" in (tmp_path / "r6" / "report.md").read_text()
    proc = run_cli(["report", runs[0], "--by", "algorithm.nmae", "--out", tmp_path / "r5"])
    assert proc.returncode == 2 and "algorithm.nmae" in proc.stderr and "Traceback" not in proc.stderr


def test_report_of_nothing_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_cli(["report", tmp_path / "empty"])
    assert proc.returncode == 2 and "no runs under" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli(["report", tmp_path / "missing"])
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    shutil.rmtree(tmp_path / "empty")
