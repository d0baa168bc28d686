"""`distfl report`: the table's numbers are the runs' summaries, grouped by the swept keys, and the
plots are written."""
from __future__ import annotations

import csv
import shutil
import statistics

from conftest import metrics, run_cli, summary, write_config


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
    # Ranked: the highest mean final test accuracy first (table and CSV); --sort KEY orders by a key.
    means = [float(r["final_acc_mean"]) for r in rows]
    assert sorted(r["algorithm.name"] for r in rows) == ["fedavg", "fedprox"] and means == sorted(means, reverse=True)
    table = [line.split(" | ")[0].lstrip("| ") for line in (out / "report.md").read_text().splitlines()[6:8]]
    assert table == [r["algorithm.name"] for r in rows]
    assert run_cli(["report", sweep_dir, "--sort", "algorithm.name", "--out", tmp_path / "r1"]).returncode == 0
    assert [r["algorithm.name"] for r in _csv(tmp_path / "r1" / "report.csv")] == ["fedavg", "fedprox"]
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


def _report_api(paths, metric, keys=None):
    """The groups and labels `distfl report` draws, computed here through its own functions."""
    from distfl import report

    runs = [report.load_run(d) for d in report.find_runs(paths)]
    keys = keys if keys is not None else report.grouping_keys(runs, report.swept_keys(runs, paths))
    rows = report.summarise(runs, keys, [metric])
    return rows, report.labels(rows, keys)


def test_report_of_a_personalised_sweep_ranks_by_client_accuracy(tmp_path):
    """eval.clients runs are reported by per-client accuracy by default (table, CSV, figures), and a seed
    found in two reported directories counts once, with a warning."""
    from distfl import figures

    sweep_dir = tmp_path / "sw"
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(sweep_dir)},
                       eval={"every": 3, "clients": True})
    proc = run_cli(["sweep", cfg, "--grid", "algorithm.name=fedavg,ditto", "--seeds", "0,1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    copy = tmp_path / "copy" / "ditto0"
    shutil.copytree(sweep_dir / "algorithm.name=ditto" / "seed=0", copy)
    proc = run_cli(["report", sweep_dir, copy, "--out", tmp_path / "r"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning: seed 0 of ditto is in 2 directories" in proc.stderr and "same model_sha256" in proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {r["algorithm.name"]: r for r in _csv(tmp_path / "r" / "report.csv")}
    md = (tmp_path / "r" / "report.md").read_text()
    assert "final client_acc_mean % (mean ± std)" in md and "final client_acc_p10 %" in md
    assert (tmp_path / "r" / "client_acc_mean_vs_round.png").exists()
    plot_rows, names = _report_api([sweep_dir, copy], "client_acc_mean")
    fig, _ = figures.draw(plot_rows, names, "client_acc_mean")
    plotted = {line.get_label().split(" (n=")[0]: line for line in fig.axes[0].lines}
    for name in ("fedavg", "ditto"):
        runs = [sweep_dir / f"algorithm.name={name}" / f"seed={s}" for s in (0, 1)]
        row = rows[name]
        assert row["runs"] == "2" and row["seeds"] == "0,1"
        for stat in ("mean", "p10", "min"):
            values = [summary(r)["final_client_acc"][stat] for r in runs]
            assert float(row[f"client_acc_{stat}.mean"]) == statistics.fmean(values)
            assert float(row[f"client_acc_{stat}.std"]) == statistics.stdev(values)
        values = [summary(r)["final_client_acc"]["mean"] for r in runs]
        cell = f"{100 * statistics.fmean(values):.2f} ± {100 * statistics.stdev(values):.2f}"
        assert cell in md and cell in proc.stdout
        # The figure's points: per round, 100 x the seeds' mean of metrics.jsonl's client_acc_mean.
        line = plotted[name]
        assert list(line.get_xdata()) == [3, 6]
        for t, y in zip((3, 6), line.get_ydata()):
            assert y == 100 * statistics.fmean(next(m["client_acc_mean"] for m in metrics(r) if m["round"] == t)
                                               for r in runs)
    # Asked for explicitly, any number of metrics.jsonl or summary.json, first one plotted.
    proc = run_cli(["report", sweep_dir, "--out", tmp_path / "r2", "--metric", "train_loss",
                    "--metric", "final_client_acc.std"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(r for r in _csv(tmp_path / "r2" / "report.csv") if r["algorithm.name"] == "fedavg")
    runs = [sweep_dir / "algorithm.name=fedavg" / f"seed={s}" for s in (0, 1)]
    assert float(row["train_loss.mean"]) == statistics.fmean(metrics(r)[-1]["train_loss"] for r in runs)
    assert float(row["final_client_acc.std.mean"]) == statistics.fmean(summary(r)["final_client_acc"]["std"]
                                                                       for r in runs)
    assert (tmp_path / "r2" / "train_loss_vs_round.svg").exists()
    proc = run_cli(["report", sweep_dir, "--out", tmp_path / "r3", "--metric", "client_acc_maen"])
    assert proc.returncode == 2 and "did you mean 'client_acc_mean'" in proc.stderr


def _table_py_scores(root):
    """experiments/all_methods/table.py's score column: (split, method label) -> cell text, in its order."""
    import subprocess
    import sys

    from conftest import REPO

    out = subprocess.run([sys.executable, REPO / "experiments/all_methods/table.py", root], capture_output=True,
                         text=True, check=True).stdout
    scores = {}
    for line in out.split("\n\nPer seed")[0].splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if "**" in cells[3] and "diverged" not in cells[3]:
            scores[(cells[0], cells[1].rsplit(" (", 1)[0])] = cells[3].split("**")[1]
    return scores


def test_report_of_all_methods_reproduces_its_table_ranking(tmp_path):
    """The committed experiments/all_methods runs: distfl report's numbers are table.py's scores
    (per-client mean for the personalised methods and FedAvg + FT, global test accuracy for the others),
    so both rank the methods alike."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "experiments" / "all_methods"))
    try:
        import table
    finally:
        sys.path.pop(0)
    root = REPO / "experiments" / "all_methods" / "runs"
    expected = _table_py_scores(root)
    proc = run_cli(["report", root, "--out", tmp_path / "r"])  # the default metrics: these runs evaluated clients
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = {}
    for row in _csv(tmp_path / "r" / "report.csv"):
        method = row["algorithm.name"]
        calibrated = row["calibration.method"] in ("ffc", "ccvr")
        method = ("fedavg_ft" if row["eval.finetune_epochs"] == "5" else "gma" if row["aggregation.mask"] == "gma"
                  else "fedavg_e11" if row.get("train.local_epochs") == "11"
                  else "spherefed" if calibrated and row["model.head"] == "sphere"
                  else row["calibration.method"] if calibrated else method)
        split = {"dirichlet": "Dir(0.1)", "n_classes": "#C=2"}[row["partition.scheme"]]
        metric = "client_acc_mean" if method in table.PERSONALISED else "test_acc"
        if not row[f"{metric}.mean"]:
            continue  # all its seeds diverged: table.py shows "diverged"
        mean, std = float(row[f"{metric}.mean"]), row[f"{metric}.std"]
        got[(split, table.LABELS.get(method, method))] = (100 * mean, 100 * float(std) if std else None)
    assert set(expected) <= set(got)
    for key, cell in expected.items():
        # table.py averages percentages, the report fractions: equal to the last printed digit.
        mean, _, std = cell.partition(" ± ")
        assert abs(got[key][0] - float(mean)) <= 0.0051, key
        assert (got[key][1] is None) == (not std) and (not std or abs(got[key][1] - float(std)) <= 0.0051), key
    for split in ("Dir(0.1)", "#C=2"):
        # methods level to table.py's printed digit (FedPer and FedALA at 92.91 on Dir(0.1)) in the report's order
        ranked = sorted((k for k in expected if k[0] == split),
                        key=lambda k: (-float(expected[k].split(" ±")[0]), -got[k][0]))
        assert ranked == sorted(ranked, key=lambda k: -got[k][0])


def test_figures_of_a_2x2_sweep(tmp_path):
    """A reviewer's checks of the figures: integer round ticks, the legend clear of every point and band,
    short labels of the keys that differ, markers only at evaluations, the band's meaning in the
    caption, PDF and SVG beside PNG, and a simulated-time figure where the runs logged one."""
    import json

    from distfl import figures

    sweep_dir = tmp_path / "sw"
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(sweep_dir)}, eval={"every": 2})
    proc = run_cli(["sweep", cfg, "--grid", "algorithm.name=fedavg,fedprox", "--grid", "train.lr=0.05,0.1",
                    "--seeds", "0,1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Simulated time, as runs with a virtual clock log it: round t ends at 10 t seconds.
    for path in sweep_dir.glob("*/seed=*/metrics.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "virtual_time_s": 10.0 * r["round"]}) + "\n" for r in rows))
    out = tmp_path / "r"
    proc = run_cli(["report", sweep_dir, "--out", out, "--label", "fedprox, lr=0.1:FedProx (lr 0.1)"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for stem in ("acc_vs_round", "acc_vs_time", "acc_vs_virtual_time"):
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"
        assert "<svg" in (out / f"{stem}.svg").read_text()[:1000]
    assert "FedProx (lr 0.1) (n=2)" in (out / "acc_vs_round.svg").read_text()  # --label renames a line
    for stem in ("acc_vs_round", "acc_vs_time", "acc_vs_virtual_time"):  # the caption is beside, not inside
        svg = (out / f"{stem}.svg").read_text()
        assert "seed" not in svg and "standard deviation" not in svg
        assert "standard deviation" in (out / f"{stem}.txt").read_text()
    assert "Test accuracy (%)" in svg and "Simulated time (s)" in svg
    md = (out / "report.md").read_text()
    assert "shaded band: ±1 standard deviation over the seeds" in md and "over 2 seed(s)" in md

    rows, names = _report_api([sweep_dir], "test_acc")
    assert names == ["fedavg, lr=0.05", "fedavg, lr=0.1", "fedprox, lr=0.05", "fedprox, lr=0.1"]
    for x_key in ("round", "wall_s", "virtual_time_s"):
        fig, caption = figures.draw(rows, names, "test_acc", x_key)
        ax = fig.axes[0]
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend = ax.get_legend().get_window_extent(renderer)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"{n} (n=2)" for n in names]
        for line in ax.lines:
            for x, y in ax.transData.transform(line.get_xydata()):
                assert not legend.contains(x, y)
        for band in ax.collections:
            assert not legend.overlaps(band.get_window_extent(renderer))
        assert len(ax.collections) == 4 and "±1 standard deviation" in caption
        if x_key == "round":
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert ticks and all(t == int(t) for t in ticks)
            assert all("." not in label.get_text() for label in ax.get_xticklabels())
        if x_key == "virtual_time_s":
            assert list(ax.lines[0].get_xdata()) == [20.0, 40.0, 60.0]
    # A metric logged every round is a line with markers only at the evaluations (rounds 2, 4, 6).
    rows, names = _report_api([sweep_dir], "train_loss")
    fig, _ = figures.draw(rows, names, "train_loss")
    line = fig.axes[0].lines[0]
    assert list(line.get_xdata()) == [1, 2, 3, 4, 5, 6] and list(line.get_markevery()) == [1, 3, 5]


def test_report_of_a_sweep_over_a_system_key(tmp_path):
    """A sync-vs-async study as a paper needs it: grouped by the canonical key whatever its spelling, rows
    ranked by per-client accuracy, a `key=value:Label` label naming table rows and lines, figures with
    readable axes and no caption drawn in them (it is in a .txt beside each and in report.md), each
    run's per-client results in clients.csv (equal to its evaluation's statistics) and their CDF."""
    from distfl.federation.client_eval import accuracy_statistics

    sweep_dir = tmp_path / "sw"
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(sweep_dir)}, eval={"every": 2, "clients": True},
                       system={"speed": "lognormal:0,1", "bandwidth": "uniform:100,1000", "buffer_size": 2})
    proc = run_cli(["sweep", cfg, "--grid", "system.async=none,fedbuff", "--seeds", "0,1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for run in sweep_dir.glob("*/seed=*"):
        last = [r for r in metrics(run) if "client_acc_mean" in r][-1]
        with open(run / "clients.csv") as f:
            clients = list(csv.DictReader(f))
        correct = [int(c["correct"]) for c in clients]
        total = [int(c["test_samples"]) for c in clients]
        assert len(clients) == 12 and {c["round"] for c in clients} == {str(last["round"])}
        assert accuracy_statistics(correct, total) == {k: last[k] for k in accuracy_statistics(correct, total)}
        assert [float(c["accuracy"]) for c in clients if c["accuracy"]] == [a / b for a, b in zip(correct, total) if b]

    out = tmp_path / "r"
    proc = run_cli(["report", sweep_dir, "--out", out, "--label", "async_mode=none:FedAvg sync", "--per-client",
                    "--style", "paper"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _csv(out / "report.csv")
    assert "system.async" not in rows[0] and {r["system.async_mode"] for r in rows} == {"none", "fedbuff"}
    assert {r["group"] for r in rows} == {"FedAvg sync", "async_mode=fedbuff"}
    means = [float(r["client_acc_mean.mean"]) for r in rows]
    assert means == sorted(means, reverse=True)
    md = (out / "report.md").read_text()
    assert "| FedAvg sync | none |" in md and "rows sorted by client_acc_mean" in md
    for stem in ("client_acc_mean_vs_round", "client_acc_mean_vs_virtual_time", "client_acc_cdf"):
        svg = (out / f"{stem}.svg").read_text()
        caption = (out / f"{stem}.txt").read_text().strip()
        assert caption in md and "Line: mean" not in svg and "seed(s)" not in svg and "CDF" not in svg
        assert (out / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"
    svg = (out / "client_acc_mean_vs_virtual_time.svg").read_text()
    assert "Mean client accuracy (%)" in svg and "Simulated time (" in svg and "FedAvg sync (n=2)" in svg
    assert "Fraction of clients" in (out / "client_acc_cdf.svg").read_text()
    # --by takes either spelling.
    proc = run_cli(["report", sweep_dir, "--out", tmp_path / "r2", "--by", "system.async"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {r["system.async_mode"] for r in _csv(tmp_path / "r2" / "report.csv")} == {"none", "fedbuff"}


def test_axis_units_follow_the_magnitude():
    from distfl import figures

    assert figures.x_axis("virtual_time_s", 90.0) == (1.0, "Simulated time (s)")
    assert figures.x_axis("virtual_time_s", 1296.0) == (1 / 60, "Simulated time (min)")
    assert figures.x_axis("virtual_time_s", 7.5 * 3600) == (1 / 3600, "Simulated time (h)")
    assert figures.x_axis("wall_s", 3 * 86400) == (1 / 86400, "Wall time (d)")
    assert figures.metric_axis("bytes_up", 3.2e6) == (1e-6, "Upload (MB)")
    assert figures.metric_axis("client_acc_p10", 0.5) == (100.0, "Client accuracy, 10th percentile (%)")
    assert figures.metric_axis("train_loss", 2.3) == (1.0, "Training loss")


def test_report_options_are_never_config_overrides(tmp_path):
    """A label that looks like `key=value` stays the label's (the run directory is checked first here)."""
    proc = run_cli(["report", tmp_path / "missing", "--label", "dropout=0.0, round=wait_all:FedAvg sync"])
    assert proc.returncode == 2 and "does not exist" in proc.stderr, proc.stderr
    proc = run_cli(["report", tmp_path / "missing", "--size", "3.4"])  # refused before anything is read
    assert proc.returncode == 2 and "--size '3.4': expected WIDTH,HEIGHT in inches" in proc.stderr, proc.stderr
    from distfl.report import parse_label

    assert parse_label("dropout=0.0, round=wait_all:FedAvg sync") == ("dropout=0.0, round=wait_all", "FedAvg sync")


def test_accuracy_against_upload_bytes(tmp_path):
    """`distfl report` draws accuracy against the bytes the clients uploaded so far (acc_vs_upload): each
    point's x is the run's cumulative bytes_up at that evaluation, in the unit its size calls for; a
    top-k run at 5% density ends at about a tenth of the plain run's bytes (values and indices)."""
    from distfl import figures

    cfg = write_config(tmp_path / "c.yaml", eval={"every": 2})
    for name, extra in (("plain", ()), ("topk", ("compression.up=topk", "compression.density=0.05"))):
        proc = run_cli(["train", cfg, f"output.dir={tmp_path / 'runs' / name}", *extra])
        assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "r"
    proc = run_cli(["report", tmp_path / "runs", "--out", out])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "acc_vs_upload.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Upload (" in (out / "acc_vs_upload.svg").read_text()
    rows, _ = _report_api([tmp_path / "runs"], "test_acc")
    ends = []
    for row in rows:
        curve = figures.curves(row, "test_acc", figures.UPLOAD)
        logged = sorted(row["_runs"][0].logged("bytes_up"), key=lambda r: r["round"])
        cumulative = {r["round"]: sum(e["bytes_up"] for e in logged[:i + 1]) for i, r in enumerate(logged)}
        assert curve["x"] == [cumulative[t] for t in curve["round"]]
        ends.append(curve["x"][-1])
    small, large = sorted(ends)
    assert len(ends) == 2 and 0.05 < small / large < 0.15
