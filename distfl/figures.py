"""The figures of `distfl report`: one metric of each group of runs against round, wall time, (where
the runs logged `virtual_time_s`) simulated time and (where they logged `bytes_up`) the bytes their
clients uploaded so far (`*_vs_upload`: accuracy against bytes), as PNG, PDF and SVG, meant to go into a
paper or a slide as they are.

A line is a group's mean over its seeds at the rounds that all its runs logged; its shaded band is ±1
sample standard deviation over those seeds (the caption says so, and the legend gives each line's
number of seeds). Round axes have integer ticks; markers sit only on evaluation rounds (rows with
test_acc), so a metric logged every round (train_loss) is a plain line with its evaluations marked.
Axes are named in words with their unit, the unit chosen by the data's magnitude (Simulated time (h),
Upload (MB)); accuracies are in percent. The legend sits outside the axes (to their right; above them in
the paper style), where it cannot hide a curve. No caption is drawn in the image: it is written beside
each figure (STEM.txt) and into report.md. PDFs embed TrueType fonts; SVGs keep their text as text.

Styles (--style): default (6.4 x 4.0 in), paper (3.4 x 2.5 in: one column of a two-column paper, 8 pt
text), slide (10 x 5.6 in, 16 pt text); --size W,H (inches) overrides the size.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = ("png", "pdf", "svg")
# The x axis of accuracy against bytes: the run's cumulative bytes_up (its clients' uploads) up to each round
UPLOAD = "upload_bytes"
# (metrics.jsonl key, axis name, file name part); the time axes get their unit by magnitude
X_AXES = (("round", "Round", "round"), ("wall_s", "Wall time", "time"),
          ("virtual_time_s", "Simulated time", "virtual_time"),
          (UPLOAD, "Upload", "upload"))
# --style: figure size (inches), font size (pt), where the legend goes
STYLES = {"default": {"size": (6.4, 4.0), "font": 10, "legend": "right"},
          "paper": {"size": (3.4, 2.5), "font": 8, "legend": "above"},
          "slide": {"size": (10.0, 5.6), "font": 16, "legend": "right"}}
# Metric names in words (a name not here: its words, capitalised)
METRIC_NAMES = {
    "test_acc": "Test accuracy", "test_loss": "Test loss", "train_loss": "Training loss",
    "client_acc_mean": "Mean client accuracy", "client_acc_p10": "Client accuracy, 10th percentile",
    "client_acc_min": "Lowest client accuracy", "client_acc_std": "Client accuracy, std",
    "client_acc_weighted_mean": "Client accuracy, sample-weighted", "global_train_acc": "Training accuracy",
    "global_train_loss": "Training loss of the global model", "bytes_up": "Upload", "bytes_down": "Download",
    "bytes_reduced": "Bytes reduced", "round_s": "Wall time a round", "round_virtual_s": "Simulated time a round",
}
TIME_UNITS = ((1.0, "s"), (60.0, "min"), (3600.0, "h"), (86400.0, "d"))
BYTE_UNITS = ((1.0, "B"), (1e3, "KB"), (1e6, "MB"), (1e9, "GB"), (1e12, "TB"))


@dataclass
class Figure:
    path: Path  # the PNG
    caption: str
    files: list[Path] = field(default_factory=list)


@dataclass
class Look:
    """How figures are drawn: --style, --size (inches, or None for the style's), --logx, --logy."""
    style: str = "default"
    size: tuple[float, float] | None = None
    logx: bool = False
    logy: bool = False


def is_fraction(metric: str) -> bool:
    """Accuracies are fractions, shown in percent (the time to a target accuracy is not one)."""
    return "acc" in metric and not metric.startswith("time_to_acc")


def unit_of(largest: float, units) -> tuple[float, str]:
    """(scale, unit) of `units` ((scale, name), ascending) that shows `largest` as a number of at least 1."""
    chosen = units[0]
    for scale, name in units:
        if largest >= 2 * scale if name in ("min", "h", "d") else largest >= scale:
            chosen = (scale, name)
    return chosen


def metric_axis(metric: str, largest: float) -> tuple[float, str]:
    """(factor the values are multiplied by, axis name with unit) of `metric`."""
    name = METRIC_NAMES.get(metric, metric.replace("_", " ").capitalize())
    if is_fraction(metric):
        return 100.0, f"{name} (%)"
    if "bytes" in metric:
        scale, unit = unit_of(largest, BYTE_UNITS)
        return 1.0 / scale, f"{name} ({unit})"
    if metric.endswith("_s"):
        scale, unit = unit_of(largest, TIME_UNITS)
        return 1.0 / scale, f"{name} ({unit})"
    return 1.0, name


def x_axis(x_key: str, largest: float) -> tuple[float, str]:
    """(factor, axis name with unit) of the x axis `x_key`."""
    name = next(label for key, label, _ in X_AXES if key == x_key)
    if x_key == "round":
        return 1.0, name
    scale, unit = unit_of(largest, BYTE_UNITS if x_key == UPLOAD else TIME_UNITS)
    return 1.0 / scale, f"{name} ({unit})"


def cumulative_upload(run) -> dict[int, float]:
    """{round: the bytes the run's clients uploaded in it and every round before} (bytes_up, summed);
    {} for a run that did not log them (withheld under DP)."""
    total, out = 0.0, {}
    for row in sorted(run.logged("bytes_up"), key=lambda r: r["round"]):
        total += row["bytes_up"]
        out[row["round"]] = total
    return out


def curves(row: dict, metric: str, x_key: str = "round") -> dict | None:
    """Mean and standard deviation over a group's runs (completed ones, else any) of `metric` at the
    rounds that all of them logged, with `x_key`'s mean there; None where no run logged both."""
    runs = [r for r in row["_runs"] if r.status == "completed" and r.logged(metric)] or \
        [r for r in row["_runs"] if r.logged(metric)]
    if not runs:
        return None
    by_run = [{e["round"]: e for e in r.logged(metric)} for r in runs]
    if x_key == UPLOAD:  # every round's uploads count, evaluated or not
        by_run = [{t: {**e, UPLOAD: uploaded[t]} for t, e in b.items() if t in uploaded}
                  for b, uploaded in zip(by_run, (cumulative_upload(r) for r in runs))]
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


def caption(y_label: str, x_label: str, ns: list[int]) -> str:
    seeds = f"{min(ns)}" if min(ns) == max(ns) else f"{min(ns)} to {max(ns)}"
    band = ("shaded band: ±1 standard deviation over the seeds" if max(ns) > 1
            else "one seed per line, so no band")
    return (f"{y_label} against {x_label[0].lower() + x_label[1:]}. Line: mean over {seeds} seed(s) per group "
            f"(n in the legend); {band}; markers at evaluation rounds.")


def _new_figure(look: Look):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = STYLES[look.style]
    # Fonts embedded as TrueType in PDFs (publishers refuse Type 3) and text kept as text in SVGs.
    plt.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"})
    fig, ax = plt.subplots(figsize=look.size or style["size"], dpi=300 if look.style == "paper" else 150)
    return fig, ax


def _finish(fig, ax, look: Look, x_label: str, y_label: str, count: int) -> None:
    font = STYLES[look.style]["font"]
    ax.set_xlabel(x_label, fontsize=font)
    ax.set_ylabel(y_label, fontsize=font)
    ax.tick_params(labelsize=font * 0.9)
    if look.logx:
        ax.set_xscale("log")
    if look.logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if STYLES[look.style]["legend"] == "above":
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02, 1.0, 0.2), mode="expand", borderaxespad=0.0,
                  ncol=min(2, count), fontsize=font * 0.85, frameon=False)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=font * 0.85,
                  frameon=False)


def draw(rows: list[dict], names: list[str], metric: str, x_key: str = "round", look: Look | None = None):
    """(matplotlib Figure, caption) of `metric` against `x_key` for each row, or None where no row
    has a curve (no run logged virtual_time_s)."""
    from matplotlib.ticker import MaxNLocator

    look = look or Look()
    found = [(name, c) for name, c in ((n, curves(row, metric, x_key)) for n, row in zip(names, rows)) if c]
    if not found:
        return None
    y_scale, y_label = metric_axis(metric, max(abs(v) for _, c in found for v in c["mean"]))
    x_scale, x_label = x_axis(x_key, max(abs(v) for _, c in found for v in c["x"]))
    fig, ax = _new_figure(look)
    for name, c in found:
        x = [x_scale * v for v in c["x"]]
        y = [y_scale * v for v in c["mean"]]
        line, = ax.plot(x, y, marker="o" if c["evals"] else None, markersize=3.5 if look.style != "paper" else 2.5,
                        markevery=c["evals"] or None, linewidth=1.4 if look.style != "paper" else 1.0,
                        label=f"{name} (n={c['n']})")
        if c["n"] > 1:
            ax.fill_between(x, [v - y_scale * s for v, s in zip(y, c["std"])],
                            [v + y_scale * s for v, s in zip(y, c["std"])], color=line.get_color(), alpha=0.18,
                            linewidth=0)
    if x_key == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _finish(fig, ax, look, x_label, y_label, len(found))
    return fig, caption(y_label, x_label, [c["n"] for _, c in found])


def draw_client_cdf(groups: list[tuple[str, list[float], int]], look: Look | None = None):
    """(Figure, caption) of the empirical CDF of per-client accuracy, one line per group: (name, the
    accuracies of its clients pooled over its runs, its number of runs); None where no group has any."""
    look = look or Look()
    groups = [g for g in groups if g[1]]
    if not groups:
        return None
    fig, ax = _new_figure(look)
    for name, accs, n in groups:
        xs = sorted(100 * a for a in accs)
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step([xs[0], *xs], [0.0, *ys], where="post", linewidth=1.4 if look.style != "paper" else 1.0,
                label=f"{name} (n={n})")
    ax.set_ylim(0.0, 1.0)
    _finish(fig, ax, look, "Client accuracy (%)", "Fraction of clients", len(groups))
    text = ("Empirical CDF of the clients' accuracy at each run's last evaluation (RUN_DIR/clients.csv): the "
            "fraction of clients at or below each accuracy, the clients of a group's runs pooled (n: runs).")
    return fig, text


def save(fig, stem: Path, text: str) -> Figure:
    """`fig` as STEM.png, .pdf and .svg, and its caption as STEM.txt."""
    import matplotlib.pyplot as plt

    figure = Figure(stem.with_suffix(".png"), text)
    for fmt in FORMATS:
        path = stem.with_suffix(f".{fmt}")
        # SVG and PDF without a creation date: the same report writes the same files.
        fig.savefig(path, bbox_inches="tight", metadata={"Date": None} if fmt in ("svg", "pdf") else None)
        figure.files.append(path)
    plt.close(fig)
    caption_path = stem.with_suffix(".txt")
    caption_path.write_text(text + "\n")
    figure.files.append(caption_path)
    return figure


def plot_all(rows: list[dict], names: list[str], metric: str, out_dir: Path, look: Look | None = None) -> list[Figure]:
    """Every figure of `metric`, each written as PNG, PDF and SVG with its caption in a .txt;
    `acc_vs_round.png` and friends for test_acc, `METRIC_vs_round.png` for another metric."""
    prefix = "acc" if metric == "test_acc" else metric
    written = []
    for x_key, _, part in X_AXES:
        drawn = draw(rows, names, metric, x_key, look)
        if drawn is not None:
            written.append(save(drawn[0], out_dir / f"{prefix}_vs_{part}", drawn[1]))
    return written
