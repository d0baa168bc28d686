"""The sweep description: grid keys and values (`--grid`, the `sweep:` block), seeds, every point's
config and run directory name, checked before anything is written; and its record, SWEEP_DIR/sweep.json."""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..config import (FEATURE_OPTIONS_KEY, OPTIONS_KEY, SWEEP_BLOCK, apply_overrides, config_keys, config_to_dict,
                      flatten_dict, load_config, load_sweep_block)
from ..config.renamed import RENAMED, SPELLINGS, reads
from ..errors import ConfigError, DistflError
from .slurm import SLURM_OPTIONS, check_slurm_available, check_slurm_options, slurm_active_jobs
from .plan import Point, Sweep
from .state import FINISHED, point_state, value_text

EXECUTORS = ("local", "slurm")
SWEEP_KEYS = ("grid", "points", "zip", "seeds", "executor", "nproc", "slurm")
SWEEP_FILE = "sweep.json"
SAFE = re.compile(r"[^A-Za-z0-9._+\-]")


def _check_grid_key(key: str, where: str) -> None:
    keys = config_keys()
    if key.startswith((OPTIONS_KEY + ".", FEATURE_OPTIONS_KEY + ".")) and not key.endswith("."):
        return  # a method's or feature's option: each point's config checks it against its Options
    if key in RENAMED or key in SPELLINGS:
        return  # an old name of a method's option, or another spelling of a key (distfl/config/renamed.py)
    if key in keys:
        if key == "seed":
            raise ConfigError(f"{where}: give seeds with --seeds 0,1,2 (or `seeds:` in the sweep block), "
                              "not as a grid key; each seed gets its own seed=S directory")
        if key == "output.dir":
            raise ConfigError(f"{where}: output.dir cannot be swept; it is the sweep directory, and each "
                              "point's run directory is named after its overrides")
        return
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"{where}: {key!r} is not a config key{hint} (every key is listed in docs/config.md)")


def parse_grid_arg(item: str) -> tuple[str, list[str]]:
    """`--grid key=v1,v2` -> (key, ["v1", "v2"])."""
    key, sep, text = item.partition("=")
    key = key.strip()
    values = [v.strip() for v in text.split(",")]
    if not sep or not key or not text.strip() or any(v == "" for v in values):
        raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,... e.g. --grid algorithm.name=fedavg,scaffold")
    _check_grid_key(key, f"--grid {item!r}")
    return key, values


def _grid_from_block(grid, where: str) -> dict[str, list[str]]:
    if not isinstance(grid, dict):
        raise ConfigError(f"{where} must be a mapping of config keys to lists of values, "
                          f"e.g. {{algorithm.name: [fedavg, scaffold]}}; got {grid!r}")
    out = {}
    for key, values in flatten_dict(grid).items():
        _check_grid_key(key, f"{where}.{key}")
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise ConfigError(f"{where}.{key}: the list of values is empty")
        out[key] = [value_text(v, f"{where}.{key}") for v in values]
    return out


def _listed_point(item, where: str) -> dict[str, str]:
    """One listed point: a mapping of config keys (dotted, or nested) to values -> key -> value text."""
    if not isinstance(item, dict) or not item:
        raise ConfigError(f"{where}: a point is a mapping of config keys to values, e.g. "
                          f"{{algorithm.name: fedavg, eval.finetune_epochs: 5}}; got {item!r}")
    out = {}
    for key, value in flatten_dict(item).items():
        _check_grid_key(key, f"{where}.{key}")
        out[key] = value_text(value, f"{where}.{key}")
    return out


def load_points(value, where: str) -> list[dict[str, str]]:
    """`--points FILE` (YAML or JSON: a list of mappings) or the sweep block's `points:` (the list, or a
    file name relative to the config) -> the listed points."""
    from ..yaml_loader import read_yaml

    if isinstance(value, str):
        path = Path(value)
        if not path.is_file():
            raise ConfigError(f"{where}: {value} is not a file (a YAML or JSON list of mappings of overrides)")
        where, value = str(path), read_yaml(str(path))
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of points, each a mapping of overrides, e.g. "
                          "[{algorithm.name: fedavg, eval.finetune_epochs: 5}, {algorithm.name: ditto}]")
    return [_listed_point(item, f"{where}[{i}]") for i, item in enumerate(value)]


def zip_points(columns: dict[str, list[str]], where: str) -> list[dict[str, str]]:
    """Zipped keys (`--zip k=a,b --zip k2=x,y`): point i takes the i-th value of every key."""
    lengths = {k: len(v) for k, v in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ConfigError(f"{where}: zipped keys need as many values each; got "
                          + ", ".join(f"{k}: {n}" for k, n in lengths.items()))
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def parse_seeds(value, where: str = "--seeds") -> list[int]:
    """"0,1,2", "0-4", [0, 1, 2] or 3 -> a list of distinct non-negative ints, in order."""
    items = value if isinstance(value, list) else [value] if isinstance(value, int) else str(value).split(",")
    seeds = []
    for item in items:
        text = str(item).strip()
        lo, dash, hi = text.partition("-")
        try:
            if isinstance(item, bool):
                raise ValueError
            chunk = list(range(int(lo), int(hi) + 1)) if dash and lo else [int(text)]
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not a list of seeds; expected e.g. 0,1,2 or 0-4") from None
        seeds += chunk
    if not seeds or any(s < 0 for s in seeds):
        raise ConfigError(f"{where}: {value!r}: seeds must be non-negative integers, e.g. 0,1,2")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: {value!r} repeats a seed")
    return seeds


def build_sweep(config_path: str, fixed=(), grid_args=(), seeds_arg=None, executor=None, nproc=None,
                slurm_args: dict | None = None, points_arg=None, zip_args=()) -> Sweep:
    """Everything the sweep will do, checked, with nothing written: grid x seeds points and their state."""
    block = load_sweep_block(config_path)
    unknown = [k for k in block if k not in SWEEP_KEYS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), SWEEP_KEYS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"sweep.{unknown[0]} in {config_path}: unknown key; {hint}valid: {', '.join(SWEEP_KEYS)}")
    grid = _grid_from_block(block["grid"], f"sweep.grid in {config_path}") if block.get("grid") is not None else {}
    for item in grid_args:
        key, values = parse_grid_arg(item)
        grid[key] = values
    for key, values in grid.items():
        if len(set(values)) != len(values):
            raise ConfigError(f"grid {key}: {', '.join(values)} repeats a value")
    listed = _listed_points(config_path, block, points_arg, zip_args)
    for i, point in enumerate(listed):
        if point in listed[:i]:
            raise ConfigError(f"listed points {listed.index(point)} and {i} are the same run "
                              f"({', '.join(f'{k}={v}' for k, v in point.items())})")
    both = sorted(set(grid).intersection(*listed)) if listed else []
    if both:
        raise ConfigError(f"{both[0]} is both a grid key and a key of the listed points; give it in one of them")

    executor = executor or block.get("executor") or "local"
    if executor not in EXECUTORS:
        raise ConfigError(f"executor {executor!r}: valid: {', '.join(EXECUTORS)}")
    block_nproc = block.get("nproc", 1)
    nproc = nproc if nproc is not None else block_nproc
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ConfigError(f"nproc must be a positive integer (ranks per local run), got {nproc!r}")
    if executor == "slurm" and nproc != 1:
        raise ConfigError("--nproc is for --executor local; on Slurm the ranks of a run are "
                          "nodes x tasks_per_node (--nodes, --tasks-per-node)")
    slurm_block = block.get("slurm") or {}
    if not isinstance(slurm_block, dict):
        raise ConfigError(f"sweep.slurm in {config_path} must be a mapping of Slurm options, got {slurm_block!r}")
    slurm = {name: spec[1] for name, spec in SLURM_OPTIONS.items()}
    slurm.update(check_slurm_options(slurm_block, f"sweep.slurm in {config_path}"))
    cli_slurm = check_slurm_options(slurm_args or {}, "command line")
    if "additional" in cli_slurm and slurm.get("additional"):
        cli_slurm["additional"] = {**slurm["additional"], **cli_slurm["additional"]}
    slurm.update(cli_slurm)

    seeds_value = seeds_arg if seeds_arg is not None else block.get("seeds")
    base = _base_config(config_path, list(fixed), grid, listed)
    seeds = parse_seeds(seeds_value, "--seeds" if seeds_arg is not None else "sweep.seeds") \
        if seeds_value is not None else [base.seed]
    if executor == "slurm":
        check_slurm_available()

    sweep_dir = Path(base.output.dir).resolve()
    sweep = Sweep(config_path, list(fixed), grid, seeds, executor, nproc, slurm, sweep_dir, listed=listed)
    sweep.points = _expand_points(sweep)
    for point in sweep.points:
        point.state = point_state(point.run_dir, point.config)
    _mark_queued(sweep)
    return sweep


def _listed_points(config_path: str, block: dict, points_arg, zip_args) -> list[dict[str, str]]:
    """The listed points of the sweep block (`points:`, `zip:`) and the command line (--points FILE,
    --zip KEY=V1,V2: replace the block's)."""
    if points_arg is not None and zip_args:
        raise ConfigError("--points and --zip: give the points one way (--zip KEY=V1,V2 is a short list)")
    if points_arg is not None:
        return load_points(points_arg, "--points")
    if zip_args:
        return zip_points(dict(parse_grid_arg(item) for item in zip_args), "--zip")
    where = f"sweep.points in {config_path}"
    points = block.get("points")
    if isinstance(points, str):
        points = str(Path(config_path).parent / points)
    listed = load_points(points, where) if points is not None else []
    if block.get("zip") is not None:
        if listed:
            raise ConfigError(f"sweep.points and sweep.zip in {config_path}: give the points one way")
        listed = zip_points(_grid_from_block(block["zip"], f"sweep.zip in {config_path}"), f"sweep.zip in {config_path}")
    return listed


def _declared_options(name: str) -> set[str] | None:
    """The option names method `name` declares; None if it does not load (the point's own config check
    then says why)."""
    from .. import plugins
    from ..algorithms import algorithm_class

    try:
        return {f.name for f in plugins.options_fields(algorithm_class(name))}
    except (DistflError, KeyError):
        return None


def _applicable_options(sweep: Sweep, combos: list[list[str]]) -> list[tuple[list[str], list[str]]]:
    """(combo, extra overrides) per distinct point of the grid, where `algorithm.options.*` applies only to
    the methods that declare it. With algorithm.name a grid key (a plugin beside its baseline), an option
    that some method of the grid declares is dropped from the points whose method does not: from their
    grid values (points that then coincide are one point) and from the config and fixed overrides (an
    `algorithm.options={...}` override keeps the rest). An option no method of the grid declares is
    left in, so a typo is still refused."""
    names = list(dict.fromkeys(o.partition("=")[2] for c in combos for o in c if o.startswith("algorithm.name=")))
    if not names:
        return [(combo, []) for combo in combos]
    import yaml

    from ..yaml_loader import read_yaml

    raw = read_yaml(sweep.config_path)
    raw = {k: v for k, v in raw.items() if k != SWEEP_BLOCK} if isinstance(raw, dict) else {}
    declared = {name: _declared_options(name) for name in names}
    in_grid = set().union(*(d for d in declared.values() if d is not None))
    out, seen = [], set()
    for combo in combos:
        name = next((o.partition("=")[2] for o in combo if o.startswith("algorithm.name=")), None)
        own = declared.get(name)
        algorithm = apply_overrides(raw, [*sweep.fixed, *combo]).get("algorithm")
        options = (algorithm or {}).get("options") if isinstance(algorithm, dict) else None
        options = options if isinstance(options, dict) else {}
        unknown = sorted(k for k in options if k not in in_grid)
        if unknown and in_grid:
            close = difflib.get_close_matches(unknown[0], sorted(in_grid), n=1)
            hint = f"; did you mean '{OPTIONS_KEY}.{close[0]}'?" if close else ""
            raise ConfigError(f"{OPTIONS_KEY}.{unknown[0]}: no method of the grid (algorithm.name="
                              f"{','.join(names)}) declares it{hint} (their options: "
                              f"{', '.join(sorted(in_grid))})")
        dropped = {k for k in options if own is not None and k not in own and k in in_grid}
        # An old flat key (algorithm.mu) is dropped likewise from the points whose method does not read it.
        merged = apply_overrides(raw, [*sweep.fixed, *combo])
        unread = {o.partition("=")[0] for o in combo if o.partition("=")[0] in RENAMED
                  and not reads(o.partition("=")[0], merged)}
        kept = [o for o in combo if o.partition("=")[0] not in {f"{OPTIONS_KEY}.{k}" for k in dropped} | unread]
        extra = []
        if dropped:
            remaining = {k: v for k, v in options.items() if k not in dropped}
            extra = [f"{OPTIONS_KEY}={yaml.safe_dump(remaining, default_flow_style=True).strip()}"]
        if tuple(kept) not in seen:
            seen.add(tuple(kept))
            out.append((kept, extra))
    return out


def _base_config(config_path: str, fixed: list[str], grid: dict, listed=()):
    """The config without grid values (its output.dir is the sweep's, its seed the default one). Where
    algorithm.name is swept, options set for some of its methods need one of them: the first that takes
    them."""
    try:
        return load_config(config_path, fixed)
    except ConfigError as first:
        errors = [first]
        for name in grid.get("algorithm.name", []) or [p["algorithm.name"] for p in listed if "algorithm.name" in p]:
            try:
                return load_config(config_path, [*fixed, f"algorithm.name={name}"])
            except ConfigError as exc:
                errors.append(exc)
        # An option no method takes: the error of a method that has options names the close ones.
        raise next((e for e in errors if "declares no options" not in str(e)), first) from None


def _expand_points(sweep: Sweep) -> list[Point]:
    """Listed points x grid x seeds (the listed points outermost, in their order; grid keys in
    alphabetical order; seeds innermost), each combination's overrides in alphabetical order of their
    keys; each point's config checked. Refuses two points with one directory name, or with one config."""
    combos = [[]]
    for key in sorted(sweep.grid):
        combos = [c + [f"{key}={v}"] for c in combos for v in sweep.grid[key]]
    if sweep.listed:
        combos = [sorted([*(f"{k}={v}" for k, v in point.items()), *c], key=lambda o: o.partition("=")[0])
                  for point in sweep.listed for c in combos]
    points, seen_names, seen_configs = [], {}, {}
    for combo, extra in _applicable_options(sweep, combos):
        prefix = _combo_dir_name(combo)
        for seed in sweep.seeds:
            name = f"{prefix}/seed={seed}" if prefix else f"seed={seed}"
            run_dir = sweep.sweep_dir / name
            overrides = [*combo, *extra, f"seed={seed}"]
            try:
                cfg = load_config(sweep.config_path, [*sweep.fixed, *overrides, f"output.dir={run_dir}"])
            except ConfigError as exc:
                raise ConfigError(f"sweep point {name}: {exc}") from None
            d = config_to_dict(cfg)
            fingerprint = json.dumps({**d, "output": None}, sort_keys=True)
            if name in seen_names:
                raise ConfigError(f"sweep points {' '.join(seen_names[name])} and {' '.join(overrides)} get "
                                  f"the same directory name {name!r}; use values that differ in letters or digits")
            if fingerprint in seen_configs:
                raise ConfigError(f"sweep points {seen_configs[fingerprint]} and {name} are the same run "
                                  "(their values parse to the same config)")
            seen_names[name], seen_configs[fingerprint] = overrides, name
            points.append(Point(name, overrides, run_dir, d))
    return points


def _mark_queued(sweep: Sweep) -> None:
    """Points whose job from an earlier submission is still queued or running get state "queued": a
    second job (or a local run) on the same run directory would write over the first."""
    try:
        record = json.loads((sweep.sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return
    previous = {p.get("name"): p.get("job_id") for p in record.get("points", []) if p.get("job_id")}
    unfinished = [p for p in sweep.points if p.state not in FINISHED and previous.get(p.name)]
    if not unfinished or shutil.which("squeue") is None:
        return
    try:
        active = slurm_active_jobs()
    except (DistflError, OSError, subprocess.SubprocessError):
        return
    for point in unfinished:
        if previous[point.name] in active:
            point.state, point.job_id = "queued", previous[point.name]


def _combo_dir_name(combo: list[str]) -> str:
    """The directory of a grid combination ["k=v", ...]: "k=v,k=v" (values made safe), "" for no grid key.
    Each part, and the whole, is kept well under the 255-byte limit of a path component."""
    return _shortened(",".join(_safe_part(o) for o in combo), 200, 180, ",".join(combo))


def _safe_part(override: str) -> str:
    key, _, value = override.partition("=")
    return _shortened(f"{key}={SAFE.sub('_', value)}", 120, 100, override)


def _shortened(text: str, limit: int, keep: int, source: str) -> str:
    """`text` if it has at most `limit` characters, else its first `keep` and a hash of `source` (what
    `text` was made from, so that texts that are cut alike still differ)."""
    if len(text) <= limit:
        return text
    return text[:keep] + "-" + hashlib.sha256(source.encode()).hexdigest()[:12]


def _job_ids(earlier: list, job_id: str | None) -> list:
    return earlier + [job_id] if job_id and job_id not in earlier else earlier


def write_sweep_file(sweep: Sweep) -> None:
    path = sweep.sweep_dir / SWEEP_FILE
    previous = {}
    try:
        previous = {p["name"]: p for p in json.loads(path.read_text()).get("points", [])}
    except (OSError, ValueError):
        pass
    record = {
        "config": str(Path(sweep.config_path).resolve()),
        "overrides": sweep.fixed,
        "grid": sweep.grid,
        "listed": sweep.listed,
        "swept_keys": sweep.swept_keys,
        "seeds": sweep.seeds,
        "executor": sweep.executor,
        "nproc": sweep.nproc,
        "slurm": sweep.slurm if sweep.executor == "slurm" else None,
        "points": [{"name": p.name, "run_dir": str(p.run_dir), "overrides": p.overrides,
                    "job_id": p.job_id or previous.get(p.name, {}).get("job_id"),
                    "job_ids": _job_ids(previous.get(p.name, {}).get("job_ids", []), p.job_id)}
                   for p in sweep.points],
    }
    sweep.sweep_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)
