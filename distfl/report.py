"""`distfl report SWEEP_DIR|RUN_DIR ...`: one table and two plots for a sweep.

Runs are grouped by the keys given with --by, or else the swept keys (from SWEEP_DIR/sweep.json), or
else every config key whose value differs between the runs, leaving out seed, output.*, checkpoint.*,
runtime.* and keys no run reads; where a method option (algorithm.options.*) is one of them and the
runs' methods differ, algorithm.name too. A run whose method does not read a grouping key (a method
option it does not declare; partition.alpha of an iid split: its declared `applies`) shows "-" for it and
groups as if the key were absent. Per group, over
its completed runs (one per seed): final and best test accuracy, mean and sample standard deviation
(n-1; empty for a single run). Written to OUT/report.md, OUT/report.csv (fractions, not percent),
OUT/acc_vs_round.png and OUT/acc_vs_time.png (test accuracy against round and against wall time,
one line per group: the mean over its runs, a band of one standard deviation).
"""
from __future__ import annotations

import csv
import io
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import OPTIONS_KEY, key_applies
from .config.renamed import current_key
from .config.resume import saved_values
from .errors import DistflError

IGNORED_PREFIXES = ("seed", "output.", "checkpoint.", "runtime.")
SKIP_DIRS = {"tb", "checkpoints", "client_state", "slurm-logs", "report"}


@dataclass
class Run:
    dir: Path
    config: dict  # flat: dotted key -> value
    summary: dict | None
    rows: list[dict]

    @property
    def status(self) -> str:
        return (self.summary or {}).get("status") or "unfinished"

    def evals(self) -> list[dict]:
        return [r for r in self.rows if r.get("test_acc") is not None]


def _is_run(path: Path) -> bool:
    return (path / "config.yaml").is_file() and any((path / n).exists() for n in ("metrics.jsonl", "summary.json"))


def find_runs(paths) -> list[Path]:
    found = []
    for path in map(Path, paths):
        if not path.exists():
            raise DistflError(f"{path} does not exist")
        if _is_run(path):
            found.append(path)
            continue
        stack = [path]
        while stack:
            d = stack.pop()
            for child in sorted(d.iterdir(), reverse=True):
                if not child.is_dir() or child.name.startswith(".") or child.name in SKIP_DIRS:
                    continue
                if _is_run(child):
                    found.append(child)
                else:
                    stack.append(child)
    seen, runs = set(), []
    for p in found:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            runs.append(p)
    if not runs:
        raise DistflError(f"no runs under {', '.join(map(str, paths))}: a run directory holds config.yaml "
                          "and metrics.jsonl or summary.json")
    return sorted(runs, key=lambda p: str(p))


def load_run(run_dir: Path) -> Run:
    import yaml

    try:
        # Keys the run predates at the values it ran with, so runs of older and newer distfl group together.
        config = saved_values(yaml.safe_load((run_dir / "config.yaml").read_text()) or {})
    except (OSError, yaml.YAMLError) as exc:
        raise DistflError(f"cannot read {run_dir / 'config.yaml'}: {exc}") from None
    summary = None
    if (run_dir / "summary.json").exists():
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except ValueError as exc:
            raise DistflError(f"cannot read {run_dir / 'summary.json'}: {exc}") from None
    rows = []
    if (run_dir / "metrics.jsonl").exists():
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                break  # a line cut short by a crash: the rows before it are good
    return Run(run_dir, config, summary, rows)


def swept_keys(runs: list[Run], roots) -> list[str]:
    """The grid keys of the sweep(s) in `roots`, or the config keys whose values differ between runs."""
    keys = []
    for root in map(Path, roots):
        try:
            record = json.loads((root / "sweep.json").read_text())
        except (OSError, ValueError):
            continue
        keys += [k for k in record.get("swept_keys", []) if k not in keys]
    if keys:
        return keys
    all_keys = sorted({k for r in runs for k in r.config})
    return [k for k in all_keys if not k.startswith(IGNORED_PREFIXES) and any(key_applies(k, r.config) for r in runs)
            and len({json.dumps(r.config.get(k)) for r in runs}) > 1]


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarise(runs: list[Run], keys: list[str]) -> list[dict]:
    """One row per group of runs with equal values of `keys`, in order of first appearance."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        # A key the run does not read (a method option of another method) groups as absent, shown "-".
        groups.setdefault(tuple(run.config.get(k) if key_applies(k, run.config) else None for k in keys),
                          []).append(run)
    rows = []
    for values, members in groups.items():
        done = [r for r in members if r.status == "completed"]
        final = [r.summary["final_test_acc"] for r in done if r.summary.get("final_test_acc") is not None]
        best = [r.summary["best_test_acc"] for r in done if r.summary.get("best_test_acc") is not None]
        fm, fs = _mean_std(final)
        bm, bs = _mean_std(best)
        wm, _ = _mean_std([r.summary["wall_s"] for r in done if r.summary.get("wall_s") is not None])
        rows.append({
            **dict(zip(keys, values)),
            "runs": len(members),
            "completed": len(done),
            "diverged": sum(r.status == "diverged" for r in members),
            "seeds": ",".join(str(r.config.get("seed")) for r in done),
            "final_acc_mean": fm, "final_acc_std": fs,
            "best_acc_mean": bm, "best_acc_std": bs,
            "rounds": max((r.summary.get("rounds") or 0 for r in done), default=None),
            "wall_s_mean": wm,
            "epsilon": _privacy(done),
            "_runs": members,
        })
    return rows


def grouping_keys(runs: list[Run], keys: list[str]) -> list[str]:
    """`keys`, with algorithm.name first where a method option is among them and the runs' methods
    differ: a baseline without that option (fedavg beside a plugin) is then its own group, named."""
    if (any(k.startswith(OPTIONS_KEY + ".") for k in keys) and "algorithm.name" not in keys
            and len({r.config.get("algorithm.name") for r in runs}) > 1):
        return ["algorithm.name", *keys]
    return keys


def _cell(row: dict, key: str) -> str:
    """A group's value of `key`; "-" for a key its runs do not read (a method option their method does
    not declare, a key whose declared `applies` gives it to other choices)."""
    return "-" if row[key] is None else str(row[key])


def _privacy(runs: list[Run]) -> str | None:
    """The guarantee of a group's private runs, "epsilon (delta)" (the largest epsilon), or None."""
    found = [r.summary["privacy"] for r in runs if r.summary.get("privacy")]
    if not found:
        return None
    finite = [p["epsilon"] for p in found if p["epsilon"] is not None]
    eps = f"{max(finite):.3g}" if len(finite) == len(found) else "inf"
    return f"{eps} ({max(p['delta'] for p in found):g})"


def _label(row: dict, keys: list[str]) -> str:
    if not keys:
        runs = row["_runs"]
        return str(runs[0].config.get("algorithm.name", "runs"))
    return ", ".join(f"{k}={row[k]}" for k in keys if _cell(row, k) != "-")


def _pct(mean, std) -> str:
    if mean is None:
        return "-"
    return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "")


def to_markdown(rows: list[dict], keys: list[str], runs: list[Run]) -> str:
    private = any(row["epsilon"] for row in rows)
    head = [*keys, "seeds", "final acc % (mean ± std)", "best acc % (mean ± std)", "rounds", "wall s (mean)"]
    head += ["user-level epsilon (delta)"] if private else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [_cell(row, k) for k in keys]
        n = f"{row['completed']}" + (f" of {row['runs']}" if row["completed"] != row["runs"] else "")
        cells += [n, _pct(row["final_acc_mean"], row["final_acc_std"]), _pct(row["best_acc_mean"], row["best_acc_std"]),
                  str(row["rounds"] if row["rounds"] is not None else "-"),
                  f"{row['wall_s_mean']:.1f}" if row["wall_s_mean"] is not None else "-"]
        cells += [row["epsilon"] or "no DP"] if private else []
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    others = [r for r in runs if r.status != "completed"]
    if others:
        lines += ["", "Not in the statistics (not completed):"]
        lines += [f"- {r.dir}: {r.status}, {len(r.rows)} rounds logged" for r in others]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ["runs", "completed", "diverged", "seeds", "final_acc_mean", "final_acc_std", "best_acc_mean",
               "best_acc_std", "rounds", "wall_s_mean"]


def to_csv(rows: list[dict], keys: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    columns = CSV_COLUMNS + (["epsilon"] if any(row["epsilon"] for row in rows) else [])
    writer.writerow([*keys, *columns])
    for row in rows:
        writer.writerow(["" if row[k] is None else row[k] for k in keys] +
                        ["" if row[c] is None else row[c] for c in columns])
    return buf.getvalue()


def curves(row: dict) -> dict | None:
    """Mean (and std) test accuracy of a group at the eval rounds that all its runs reached."""
    runs = [r for r in row["_runs"] if r.status == "completed" and r.evals()] or \
        [r for r in row["_runs"] if r.evals()]
    if not runs:
        return None
    by_run = [{e["round"]: e for e in r.evals()} for r in runs]
    rounds = sorted(set.intersection(*(set(b) for b in by_run)))
    if not rounds:
        return None
    acc = [[b[t]["test_acc"] for b in by_run] for t in rounds]
    wall = [[b[t].get("wall_s", math.nan) for b in by_run] for t in rounds]
    return {
        "round": rounds,
        "acc": [statistics.fmean(a) for a in acc],
        "acc_std": [statistics.stdev(a) if len(a) > 1 else 0.0 for a in acc],
        "wall_s": [statistics.fmean(w) for w in wall],
    }


def plot(rows: list[dict], keys: list[str], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for x_key, x_label, name in (("round", "round", "acc_vs_round.png"), ("wall_s", "wall time (s)", "acc_vs_time.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        for row in rows:
            c = curves(row)
            if c is None:
                continue
            n = len([r for r in row["_runs"] if r.status == "completed"])
            x = c[x_key]
            y = [100 * a for a in c["acc"]]
            line, = ax.plot(x, y, marker="o", markersize=3, label=f"{_label(row, keys)} (n={n})")
            if any(s > 0 for s in c["acc_std"]):
                ax.fill_between(x, [v - 100 * s for v, s in zip(y, c["acc_std"])],
                                [v + 100 * s for v, s in zip(y, c["acc_std"])], color=line.get_color(), alpha=0.15)
        ax.set_xlabel(x_label)
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"test accuracy against {x_label} (mean over seeds)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main(paths, out_dir=None, stdout=None, by=None) -> int:
    stdout = stdout or sys.stdout
    run_dirs = find_runs(paths)
    runs = [load_run(d) for d in run_dirs]
    if by:
        by = [current_key(k) for k in by]  # an old name (algorithm.moon_mu) is the option it became
        unknown = [k for k in by if not any(k in r.config for r in runs)]
        if unknown:
            raise DistflError(f"--by {', '.join(unknown)}: no run's config.yaml has this key "
                              "(keys are dotted, e.g. algorithm.name)")
    keys = list(by) if by else grouping_keys(runs, [current_key(k) for k in swept_keys(runs, paths)])
    rows = summarise(runs, keys)
    if out_dir is None:
        out_dir = Path(paths[0]) / "report" if len(paths) == 1 else Path("report")
    out_dir = Path(out_dir)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DistflError("distfl report draws its plots with matplotlib: pip install matplotlib") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(rows, keys, runs)
    (out_dir / "report.md").write_text(f"# Report: {', '.join(map(str, paths))}\n\n{len(runs)} runs, grouped by "
                                       f"{', '.join(keys) or '(nothing swept)'}.\n\n" + markdown +
                                       "\n![accuracy against round](acc_vs_round.png)\n"
                                       "![accuracy against wall time](acc_vs_time.png)\n")
    (out_dir / "report.csv").write_text(to_csv(rows, keys))
    plots = plot(rows, keys, out_dir)
    print(markdown, file=stdout)
    print(f"distfl report: {len(runs)} runs in {len(rows)} groups; wrote {out_dir / 'report.md'}, "
          f"{out_dir / 'report.csv'}, {', '.join(str(p) for p in plots)}", file=stdout)
    return 0
