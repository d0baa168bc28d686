"""`distfl report SWEEP_DIR|RUN_DIR ...`: one table and a set of figures for a sweep.

Runs are grouped by the keys given with --by, or else by every config key whose value differs between
the runs (and the swept keys of SWEEP_DIR/sweep.json), leaving out seed, output.*, checkpoint.*, runtime.*
and keys no run reads; where a method option (algorithm.options.*) is one of them and the runs' methods
differ, algorithm.name too. A run whose method does not read a grouping key (a method option it does
not declare; partition.alpha of an iid split: its declared `applies`) shows "-" for it and groups as if the
key were absent. A seed found in two reported directories of one group counts once, with a warning.

The metrics (--metric NAME, several allowed) are any number a run logs in metrics.jsonl (its final value:
the summary's final_NAME where the summary has one, else the last logged value) or any scalar of
summary.json (nested keys dotted: final_client_acc.p10, privacy.epsilon). By default: the per-client
mean accuracy with its p10 and minimum across clients, and the global test accuracy, when the runs
evaluated clients (eval.clients); the global test accuracy otherwise. Per group, over its completed runs
(one per seed): the mean and sample standard deviation (n-1; empty for a single run) of each metric.

Where runs had a target accuracy (eval.target_acc), the time to reach it (summary.json's time_to_acc)
is a metric too. Rows are ranked by the first metric (accuracies highest first, others lowest first), or
by --sort KEY; --label renames a group in the table and the figures.

Written to OUT/report.md, OUT/report.csv (fractions, not percent) and the figures of the first metric
(distfl.figures): against round, wall time and, where the runs logged it, simulated time; with
--per-client, the CDF of per-client accuracy from each run's clients.csv.
"""
from __future__ import annotations

import csv
import io
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import OPTIONS_KEY, flatten_dict, key_applies
from .config.renamed import current_key, respelled
from .config.resume import saved_values
from .errors import DistflError
from .figures import is_fraction, plot_all

IGNORED_PREFIXES = ("seed", "output.", "checkpoint.", "runtime.")
SKIP_DIRS = {"tb", "checkpoints", "client_state", "slurm-logs", "report"}
CLIENT_METRICS = ["client_acc_mean", "client_acc_p10", "client_acc_min"]


@dataclass
class Run:
    dir: Path
    config: dict  # flat: dotted key -> value
    summary: dict | None
    rows: list[dict]

    @property
    def status(self) -> str:
        """summary.json's status (completed is the only finished one); "unfinished" without one, or for a
        "completed" that covers fewer rounds than the run's config: a summary written before distfl
        marked resumed sessions, kept by a resume to more rounds that did not end."""
        status = (self.summary or {}).get("status") or "unfinished"
        spent = (self.summary or {}).get("time_budget") or {}  # train.virtual_time_s ended it before train.rounds
        if status == "completed" and not spent.get("round") and \
                (self.summary.get("rounds") or 0) < (self.config.get("train.rounds") or 0):
            return "unfinished"
        return status

    def how_far(self) -> str:
        """A run that is not completed: its status, why it stopped and the round it reached."""
        s = self.summary or {}
        why = f" by {s['stopped_because']}" if self.status == "stopped" and s.get("stopped_because") else ""
        reached = (f" at round {s['round_reached']} of {s.get('train_rounds')}"
                   if self.status != "unfinished" and s.get("round_reached") is not None else "")
        return f"{self.status}{why}{reached}, {len(self.rows)} rounds logged"

    def evals(self) -> list[dict]:
        return [r for r in self.rows if r.get("test_acc") is not None]

    def logged(self, name: str) -> list[dict]:
        """The metrics.jsonl rows that hold a number for `name`."""
        return [r for r in self.rows if _number(r.get(name))]

    def summary_scalars(self) -> dict:
        """summary.json's numbers, nested keys dotted (final_client_acc.mean)."""
        return {k: v for k, v in flatten_dict(self.summary or {}).items() if _number(v)}

    def final(self, name: str) -> float | None:
        """The run's final value of metric `name`: the summary's (final_test_acc, final_client_acc's
        entry, final_NAME, NAME) where it has one, else the last value metrics.jsonl holds."""
        s = self.summary or {}
        if name == "test_acc" and "final_test_acc" in s:
            return s["final_test_acc"]
        if name.startswith("client_acc_") and "final_client_acc" in s:
            return (s["final_client_acc"] or {}).get(name[len("client_acc_"):])
        scalars = self.summary_scalars()
        for key in (f"final_{name}", name):
            if key in scalars:
                return scalars[key]
        rows = self.logged(name)
        return rows[-1][name] if rows else None

    def best(self, name: str) -> float | None:
        """The best test accuracy (the summary's best_test_acc): only for test_acc."""
        return (self.summary or {}).get("best_test_acc") if name == "test_acc" else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
        config = saved_values(respelled(yaml.safe_load((run_dir / "config.yaml").read_text()) or {},
                                        str(run_dir / "config.yaml")))
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


def ended(run_dir: Path) -> bool:
    """Whether RUN_DIR holds a run that ended: summary.json says completed (covering the rounds its
    config.yaml asks for, where the folder has one) or diverged. A stopped, running or failed run did not.
    Experiment scripts skip a run that ended (experiments/lib.sh) and run the others again."""
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    import yaml

    try:
        rounds = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("train", {}).get("rounds")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        rounds = None
    config = {"train.rounds": rounds} if isinstance(rounds, int) else {}
    return Run(run_dir, config, summary, []).status in ("completed", "diverged")


def swept_keys(runs: list[Run], roots) -> list[str]:
    """The grid keys of the sweep(s) in `roots`, then the config keys whose values differ between runs."""
    keys = []
    for root in map(Path, roots):
        try:
            record = json.loads((root / "sweep.json").read_text())
        except (OSError, ValueError):
            continue
        keys += [k for k in record.get("swept_keys", []) if k not in keys]
    all_keys = sorted({k for r in runs for k in r.config})
    # A method's option differs only if it does among the runs whose method has it (ditto's lam beside fedavg
    # runs, which have no lam, is no grouping key while every ditto run has the same).
    differ = [k for k in all_keys if not k.startswith(IGNORED_PREFIXES) and any(key_applies(k, r.config) for r in runs)
              and len({json.dumps(r.config.get(k)) for r in runs
                       if k in r.config or not k.startswith(OPTIONS_KEY + ".")}) > 1]
    return keys + [k for k in differ if k not in keys]


def default_metrics(runs: list[Run]) -> list[str]:
    """Per-client accuracy (mean, p10, min) and global test accuracy where a run evaluated its clients;
    global test accuracy otherwise. Then, where runs had a target (eval.target_acc), the time to reach it:
    simulated where they had a system model, else in rounds."""
    if any(r.logged("client_acc_mean") or (r.summary or {}).get("final_client_acc") for r in runs):
        metrics = [*CLIENT_METRICS, "test_acc"]
    else:
        metrics = ["test_acc"]
    targets = [r.summary["time_to_acc"] for r in runs if (r.summary or {}).get("time_to_acc")]
    if targets:
        simulated = any("virtual_time_s" in (r.summary or {}) for r in runs)
        metrics.append(TIME_TO_ACC + (".virtual_time_s" if simulated else ".round"))
    return metrics


TIME_TO_ACC = "time_to_acc"  # summary.json's: round, virtual_time_s and wall_s of the first evaluation at the target
TIME_NAMES = {"round": "rounds", "virtual_time_s": "simulated s", "wall_s": "wall s"}


def higher_is_better(metric: str) -> bool:
    """How --sort orders a metric: accuracies highest first; losses, times and the rest lowest first."""
    return is_fraction(metric)


def sort_rows(rows: list[dict], key: str, metrics: list[str]) -> list[dict]:
    """`rows` ordered by `key`: a metric (its mean over the group's runs; accuracies highest first, others
    lowest first) or a grouping key (its values in order); groups without a value last."""
    def value(row):
        return row["metrics"][key]["final"][0] if key in metrics else row.get(key)

    known = [r for r in rows if value(r) is not None]
    try:
        known.sort(key=value, reverse=key in metrics and higher_is_better(key))
    except TypeError:  # values of several types (a key that is a number in some runs, a string in others)
        known.sort(key=lambda r: str(value(r)))
    return known + [r for r in rows if value(r) is None]


def check_metrics(names: list[str], runs: list[Run], flag: str = "--metric") -> None:
    known = sorted({k for r in runs for row in r.rows for k, v in row.items() if _number(v) and k != "round"}
                   | {k for r in runs for k in r.summary_scalars()})
    unknown = [n for n in names if n not in known and not any(r.final(n) is not None for r in runs)]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise DistflError(f"{flag} {unknown[0]}: no run logs this number; {hint}the runs have: {', '.join(known)}")


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def merge_seeds(members: list[Run], label: str, warn) -> list[Run]:
    """One run per seed: a seed found in several directories (a sweep reported beside a copy of its runs)
    counts once, the completed run with most rows first, and `warn` says which."""
    by_seed: dict = {}
    for run in members:
        by_seed.setdefault(run.config.get("seed"), []).append(run)
    kept = []
    for seed, found in by_seed.items():
        found = sorted(found, key=lambda r: (r.status != "completed", -len(r.rows)))
        kept.append(found[0])
        if len(found) > 1:
            hashes = {(r.summary or {}).get("model_sha256") for r in found if r.status == "completed"}
            same = "the same model_sha256" if len(hashes) == 1 and None not in hashes else "different results"
            warn(f"seed {seed} of {label} is in {len(found)} directories ({', '.join(str(r.dir) for r in found)}; "
                 f"{same}): counted once, from {found[0].dir}")
    return [r for r in members if r in kept]


def summarise(runs: list[Run], keys: list[str], metrics: list[str] | None = None, warn=None) -> list[dict]:
    """One row per group of runs with equal values of `keys`, in order of first appearance."""
    metrics = metrics or ["test_acc"]
    warn = warn or (lambda message: None)
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        # A key the run does not read (a method option of another method) groups as absent, shown "-".
        groups.setdefault(tuple(run.config.get(k) if key_applies(k, run.config) else None for k in keys),
                          []).append(run)
    rows = []
    for values, members in groups.items():
        row = dict(zip(keys, values))
        members = merge_seeds(members, _label(row, keys, members) or "the runs", warn)
        done = [r for r in members if r.status == "completed"]
        stats = {}
        for name in metrics:
            finals = [v for v in (r.final(name) for r in done) if v is not None]
            bests = [v for v in (r.best(name) for r in done) if v is not None]
            stats[name] = {"final": _mean_std(finals), "n": len(finals), "best": _mean_std(bests)}
        fm, fs = _mean_std([r.summary["final_test_acc"] for r in done if r.summary.get("final_test_acc") is not None])
        bm, bs = _mean_std([r.summary["best_test_acc"] for r in done if r.summary.get("best_test_acc") is not None])
        wm, _ = _mean_std([r.summary["wall_s"] for r in done if r.summary.get("wall_s") is not None])
        rows.append({
            **row,
            "runs": len(members),
            "completed": len(done),
            "diverged": sum(r.status == "diverged" for r in members),
            "seeds": ",".join(str(r.config.get("seed")) for r in done),
            "final_acc_mean": fm, "final_acc_std": fs,
            "best_acc_mean": bm, "best_acc_std": bs,
            "rounds": max((r.summary.get("rounds") or 0 for r in done), default=None),
            "wall_s_mean": wm,
            "epsilon": _privacy(done),
            "metrics": stats,
            "_runs": members,
        })
    return rows


def grouping_keys(runs: list[Run], keys: list[str]) -> list[str]:
    """`keys`, with algorithm.name first where it is among them, or where a method option is and the
    runs' methods differ: a baseline without that option (fedavg beside a plugin) is then its own group,
    named."""
    if "algorithm.name" in keys:
        return ["algorithm.name", *(k for k in keys if k != "algorithm.name")]
    if any(k.startswith(OPTIONS_KEY + ".") for k in keys) and len({r.config.get("algorithm.name") for r in runs}) > 1:
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

def _label(row: dict, keys: list[str], runs: list[Run] | None = None, common: dict | None = None) -> str:
    """A short name for a group: its values of the keys that differ, each key by its last part
    (algorithm.name by the method's name alone; a plugin `pkg.mod:Class` by Class). A value in
    `common` (key -> the value most groups share) is left out: the groups it would name differ
    elsewhere, and the others show their own value of that key."""
    if not keys:
        return str((runs or row["_runs"])[0].config.get("algorithm.name", "runs"))
    # The key's last part, or its last two where the last alone says little (calibration.method).
    short = {k: ".".join(k.split(".")[-2 if k.rsplit(".", 1)[-1] in ("name", "method", "mode") else -1:])
             for k in keys}
    repeated = {s for s in short.values() if list(short.values()).count(s) > 1}
    parts = []
    for k in keys:
        if row[k] is None:
            continue
        if k == "algorithm.name":
            parts.append(str(row[k]).rsplit(":", 1)[-1])
        elif k not in (common or {}) or json.dumps(row[k]) != common[k]:
            parts.append(f"{k if short[k] in repeated else short[k]}={row[k]}")
    return ", ".join(parts) or "(the most common values)"


def _common_values(rows: list[dict], keys: list[str]) -> dict:
    """key -> the value (JSON) that more groups have than any other value of it."""
    from collections import Counter

    common = {}
    for k in keys:
        counts = Counter(json.dumps(row[k]) for row in rows if row[k] is not None).most_common(2)
        if counts and (len(counts) == 1 or counts[0][1] > counts[1][1]):
            common[k] = counts[0][0]
    return common


def labels(rows: list[dict], keys: list[str], renames: dict | None = None) -> list[str]:
    """Each row's label; `renames` (automatic label -> text, from --label) overrides some."""
    if len(rows) > 1:  # only the keys whose values differ between the groups name them
        keys = [k for k in keys if len({json.dumps(row[k]) for row in rows}) > 1] or keys
    common = _common_values(rows, keys) if len(rows) > 2 else {}
    auto = [_label(row, keys, common=common) for row in rows]
    unknown = [a for a in (renames or {}) if a not in auto]
    if unknown:
        raise DistflError(f"--label {unknown[0]!r}: no group has this label; the labels are: "
                          + "; ".join(repr(a) for a in auto))
    return [(renames or {}).get(a, a) for a in auto]


def parse_label(text: str) -> tuple[str, str]:
    """`--label "AUTOMATIC LABEL:TEXT"` (split at the last colon)."""
    auto, sep, new = text.rpartition(":")
    if not sep or not auto.strip() or not new.strip():
        raise DistflError(f"--label {text!r}: expected AUTOMATIC LABEL:NEW TEXT, e.g. "
                          "--label 'fedavg, finetune_epochs=5:FedAvg + FT'")
    return auto.strip(), new.strip()


def _pct(mean, std, metric: str = "test_acc") -> str:
    if mean is None:
        return "-"
    if not is_fraction(metric):
        return f"{mean:.4g}" + (f" ± {std:.2g}" if std is not None else "")
    return f"{100 * mean:.2f}" + (f" ± {100 * std:.2f}" if std is not None else "")


def _n_cell(stat: dict, completed: int) -> str:
    return "" if stat["n"] == completed else f" (n={stat['n']})"


def _head(name: str) -> str:
    """A metric's column: "final NAME" for a logged metric, the time to the target in its unit for time_to_acc."""
    if name.startswith(TIME_TO_ACC + "."):
        return f"time to target ({TIME_NAMES.get(name.partition('.')[2], name.partition('.')[2])}, mean ± std)"
    unit = " %" if is_fraction(name) else ""
    return f"{name}{unit} (mean ± std)" if "." in name else f"final {name}{unit} (mean ± std)"


def to_markdown(rows: list[dict], keys: list[str], runs: list[Run], metrics: list[str] | None = None,
                names: list[str] | None = None) -> str:
    """The table; `names`: a first column naming each group (--label)."""
    metrics = metrics or ["test_acc"]
    private = any(row["epsilon"] for row in rows)
    head = [*(["group"] if names else []), *keys, "seeds"]
    for name in metrics:
        head.append(_head(name))
        if name == "test_acc":
            head.append("best test_acc % (mean ± std)")
    head += ["rounds", "wall s (mean)"] + (["user-level epsilon (delta)"] if private else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(rows):
        cells = [*([names[i]] if names else []), *(_cell(row, k) for k in keys)]
        cells.append(f"{row['completed']}" + (f" of {row['runs']}" if row["completed"] != row["runs"] else ""))
        for name in metrics:
            stat = row["metrics"][name]
            if name.startswith(TIME_TO_ACC + ".") and stat["n"] != row["completed"]:  # some runs never reached it
                cells.append(f"not reached in {row['completed']} run(s)" if not stat["n"] else
                             _pct(*stat["final"], name) + f" (reached in {stat['n']} of {row['completed']})")
                continue
            cells.append(_pct(*stat["final"], name) + _n_cell(stat, row["completed"]))
            if name == "test_acc":
                cells.append(_pct(*stat["best"], name))
        cells += [str(row["rounds"] if row["rounds"] is not None else "-"),
                  f"{row['wall_s_mean']:.1f}" if row["wall_s_mean"] is not None else "-"]
        cells += [row["epsilon"] or "no DP"] if private else []
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    others = [r for r in runs if r.status != "completed"]
    if others:
        lines += ["", "Not in the statistics (not completed):"]
        lines += [f"- {r.dir}: {r.how_far()}" for r in others]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ["runs", "completed", "diverged", "seeds", "final_acc_mean", "final_acc_std", "best_acc_mean",
               "best_acc_std", "rounds", "wall_s_mean"]


def to_csv(rows: list[dict], keys: list[str], metrics: list[str] | None = None, names: list[str] | None = None) -> str:
    """The legacy columns (final_acc_* and best_acc_*: global test accuracy), then per metric NAME
    NAME.mean, NAME.std (over completed runs) and NAME.n (how many of them logged it). `names`: a first
    column, group, naming each row (--label)."""
    metrics = metrics or []
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    columns = CSV_COLUMNS + (["epsilon"] if any(row["epsilon"] for row in rows) else [])
    writer.writerow([*(["group"] if names else []), *keys, *columns,
                     *(f"{m}.{s}" for m in metrics for s in ("mean", "std", "n"))])
    for i, row in enumerate(rows):
        stats = [v for m in metrics for v in (*row["metrics"][m]["final"], row["metrics"][m]["n"])]
        writer.writerow(["" if v is None else v for v in [*([names[i]] if names else []), *(row[k] for k in keys),
                                                          *(row[c] for c in columns), *stats]])
    return buf.getvalue()


def client_accuracies(run: Run) -> list[float] | None:
    """The clients' accuracies at the run's last per-client evaluation (RUN_DIR/clients.csv; clients
    without test samples left out), or None where it has no such file."""
    path = run.dir / "clients.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        return [float(row["accuracy"]) for row in csv.DictReader(f) if row.get("accuracy")]


def plot_clients(rows: list[dict], names: list[str], out_dir: Path, look) -> list:
    """--per-client: the CDF of per-client accuracy of each group (its completed runs' clients pooled)."""
    from .figures import draw_client_cdf, save

    groups = []
    for name, row in zip(names, rows):
        found = [a for a in (client_accuracies(r) for r in row["_runs"] if r.status == "completed") if a is not None]
        groups.append((name, [v for accs in found for v in accs], len(found)))
    drawn = draw_client_cdf(groups, look)
    if drawn is None:
        raise DistflError("--per-client: no completed run has clients.csv; runs write it when they evaluate their "
                          "clients (eval.clients=true)")
    return [save(drawn[0], out_dir / "client_acc_cdf", drawn[1])]


def parse_size(text: str) -> tuple[float, float]:
    """--size W,H (inches)."""
    try:
        width, height = (float(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        width = height = 0.0
    if not (width > 0 and height > 0):
        raise DistflError(f"--size {text!r}: expected WIDTH,HEIGHT in inches, e.g. --size 3.4,2.5")
    return width, height


def main(paths, out_dir=None, stdout=None, by=None, metrics=None, label=None, stderr=None, sort=None,
         per_client=False, style="default", size=None, logx=False, logy=False) -> int:
    from .figures import STYLES, Look

    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    if style not in STYLES:
        raise DistflError(f"--style {style}: expected one of {', '.join(STYLES)}")
    look = Look(style, parse_size(size) if size else None, logx, logy)
    run_dirs = find_runs(paths)
    runs = [load_run(d) for d in run_dirs]
    if by:
        by = [current_key(k) for k in by]  # an old name (algorithm.moon_mu) is the option it became
        unknown = [k for k in by if not any(k in r.config for r in runs)]
        if unknown:
            raise DistflError(f"--by {', '.join(unknown)}: no run's config.yaml has this key "
                              "(keys are dotted, e.g. algorithm.name)")
    metrics = list(dict.fromkeys(metrics)) if metrics else default_metrics(runs)
    keys = list(by) if by else grouping_keys(runs, list(dict.fromkeys(map(current_key, swept_keys(runs, paths)))))
    # --sort: a metric (added to the table if not there) or a grouping key; by default the first metric.
    sort = current_key(sort) if sort else metrics[0]
    if sort != "none" and sort not in keys and sort not in metrics:
        if any(sort in r.config for r in runs):
            raise DistflError(f"--sort {sort}: not a grouping key of this report ({', '.join(keys) or 'none'}); "
                              "add it with --by, or sort by a metric")
        check_metrics([sort], runs, "--sort")
        metrics.append(sort)
    check_metrics(metrics, runs)
    renames = dict(parse_label(t) for t in label or ())

    def warn(message):
        print(f"distfl report: warning: {message}", file=stderr, flush=True)

    rows = summarise(runs, keys, metrics, warn)
    names = labels(rows, keys, renames)
    if sort != "none":
        position = {id(row): i for i, row in enumerate(rows)}
        rows = sort_rows(rows, sort, metrics)
        names = [names[position[id(row)]] for row in rows]
    if out_dir is None:
        out_dir = Path(paths[0]) / "report" if len(paths) == 1 else Path("report")
    out_dir = Path(out_dir)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DistflError("distfl report draws its plots with matplotlib: pip install matplotlib") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(rows, keys, runs, metrics, names if renames else None)
    plotted = next((m for m in metrics if any(r.logged(m) for r in runs)), None)
    figs = plot_all(rows, names, plotted, out_dir, look) if plotted else []
    if per_client:
        figs += plot_clients(rows, names, out_dir, look)
    images = "".join(f"\n![{f.path.stem}]({f.path.name})\n\n{f.caption}\n" for f in figs)
    order = f"; rows sorted by {sort}" if sort != "none" else ""
    (out_dir / "report.md").write_text(f"# Report: {', '.join(map(str, paths))}\n\n{len(runs)} runs, grouped by "
                                       f"{', '.join(keys) or '(nothing swept)'}{order}.\n\n" + markdown + images)
    (out_dir / "report.csv").write_text(to_csv(rows, keys, metrics, names if renames else None))
    print(markdown, file=stdout)
    written = [p for f in figs for p in f.files]
    print(f"distfl report: {len(runs)} runs in {len(rows)} groups; wrote {out_dir / 'report.md'}, "
          f"{out_dir / 'report.csv'}" + (f" and {len(written)} figure files ({', '.join(p.name for p in written)})"
                                         if written else ""), file=stdout)
    return 0
