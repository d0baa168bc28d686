"""The figures of `distfl report`: one metric of each group of runs against round, wall time and (where
the runs logged `virtual_time_s`) simulated time, as PNG, PDF and SVG.

A line is a group's mean over its seeds at the rounds that all its runs logged; its shaded band is ±1
sample standard deviation over those seeds (the caption says so, and the legend gives each line's
number of seeds). Round axes have integer ticks; markers sit only on evaluation rounds (rows with
test_acc), so a metric logged every round (train_loss) is a plain line with its evaluations marked.
The legend sits outside the axes, to their right, where it cannot hide a curve. PDFs embed TrueType
fonts; SVGs keep their text as text.
"""
from __future__ import annotations

import statistics
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = ("png", "pdf", "svg")
# (metrics.jsonl key, axis label, file name part)
X_AXES = (("round", "round", "round"), ("wall_s", "wall time (s)", "time"),
          ("virtual_time_s", "simulated time (s)", "virtual_time"))


@dataclass
class Figure:
    path: Path  # the PNG
    caption: str
    files: list[Path] = field(default_factory=list)


def is_fraction(metric: str) -> bool:
    """Accuracies are fractions, shown in percent."""
    return "acc" in metric


def curves(row: dict, metric: str, x_key: str = "round") -> dict | None:
    """Mean and standard deviation over a group's runs (completed ones, else any) of `metric` at the
    rounds that all of them logged, with `x_key`'s mean there; None where no run logged both."""
    runs = [r for r in row["_runs"] if r.status == "completed" and r.logged(metric)] or \
        [r for r in row["_runs"] if r.logged(metric)]
    if not runs:
        return None
    by_run = [{e["round"]: e for e in r.logged(metric)} for r in runs]
    rounds = sorted(set.intersection(*(set(b) for b in by_run)))
    if x_key != "round":
        rounds = [t for t in rounds if all(isinstance(b[t].get(x_key), (int, float)) for b in by_run)]
    if not rounds:
        return None
    values = [[b[t][metric] for b in by_run] for t in rounds]
    return {
        "x": [statistics.fmean(b[t][x_key] for b in by_run) if x_key != "round" else t for t in rounds],
        "round": rounds,
        "mean": [statistics.fmean(v) for v in values],
        "std": [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values],
        "evals": [i for i, t in enumerate(rounds) if all("test_acc" in b[t] for b in by_run)],
        "n": len(runs),
    }


def caption(metric: str, x_label: str, ns: list[int]) -> str:
    seeds = f"{min(ns)}" if min(ns) == max(ns) else f"{min(ns)} to {max(ns)}"
    band = ("shaded band: ±1 standard deviation over the seeds" if max(ns) > 1
            else "one seed per line, so no band")
    return (f"{metric} against {x_label}. Line: mean over {seeds} seed(s) per group (n in the legend); "
            f"{band}; markers at evaluation rounds.")


def draw(rows: list[dict], names: list[str], metric: str, x_key: str = "round"):
    """(matplotlib Figure, caption) of `metric` against `x_key` for each row, or None where no row
    has a curve (no run logged virtual_time_s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    x_label = next(label for key, label, _ in X_AXES if key == x_key)
    found = [(name, c) for name, c in ((n, curves(row, metric, x_key)) for n, row in zip(names, rows)) if c]
    if not found:
        return None
    scale = 100 if is_fraction(metric) else 1
    # Fonts embedded as TrueType in PDFs (publishers refuse Type 3) and text kept as text in SVGs.
    plt.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"})
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=150)
    for name, c in found:
        y = [scale * v for v in c["mean"]]
        line, = ax.plot(c["x"], y, marker="o" if c["evals"] else None, markersize=3.5, markevery=c["evals"] or None,
                        linewidth=1.4, label=f"{name} (n={c['n']})")
        if c["n"] > 1:
            ax.fill_between(c["x"], [v - scale * s for v, s in zip(y, c["std"])],
                            [v + scale * s for v, s in zip(y, c["std"])], color=line.get_color(), alpha=0.18,
                            linewidth=0)
    if x_key == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"{metric} (%)" if scale == 100 else metric)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, frameon=False)
    text = caption(metric, x_label, [c["n"] for _, c in found])
    ax.annotate("\n".join(textwrap.wrap(text, 95)), xy=(0.0, -0.16), xycoords="axes fraction", va="top",
                fontsize=7)
    return fig, text


def plot_all(rows: list[dict], names: list[str], metric: str, out_dir: Path) -> list[Figure]:
    """Every figure of `metric`, each written as PNG, PDF and SVG; `acc_vs_round.png` and friends for
    test_acc, `METRIC_vs_round.png` for another metric."""
    import matplotlib.pyplot as plt

    prefix = "acc" if metric == "test_acc" else metric
    written = []
    for x_key, _, part in X_AXES:
        drawn = draw(rows, names, metric, x_key)
        if drawn is None:
            continue
        fig, text = drawn
        stem = out_dir / f"{prefix}_vs_{part}"
        figure = Figure(stem.with_suffix(".png"), text)
        for fmt in FORMATS:
            path = stem.with_suffix(f".{fmt}")
            # SVG and PDF without a creation date: the same report writes the same files.
            fig.savefig(path, bbox_inches="tight", metadata={"Date": None} if fmt in ("svg", "pdf") else None)
            figure.files.append(path)
        plt.close(fig)
        written.append(figure)
    return written

