"""The Python entry point: `distfl.train(config, **overrides)`, the run `distfl train` makes, from a
notebook or a script.

    import distfl
    result = distfl.train("configs/quickstart.yaml", seed=1, train={"rounds": 20}, output__dir="runs/nb")
    result.summary["final_test_acc"], result.run_dir, result.metrics()[-1]

`config` is a YAML file (its `sweep:` block ignored, as `distfl train` does), a mapping shaped like
one, or None for all defaults. Each override is a config key: `seed=1`; a dotted key with `__` for the
dots (`train__lr=0.05`) or given as `**{"train.lr": 0.05}`; or a section with a mapping of its keys
(`train={"rounds": 20, "lr": 0.05}`). Values are Python values, applied as the command line's
`key=value` overrides are (so the run, and its model_sha256, are the CLI's). `resume=RUN_DIR` continues
a run from its last checkpoint, as `distfl train --resume RUN_DIR` (then `config` is left out).

The run uses this process (one rank). Progress goes to stderr as in `distfl train` (`output.progress`);
errors are raised as distfl.errors.DistflError (a bad key or value: ConfigError, before any data loads).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError


@dataclass
class RunResult:
    summary: dict  # summary.json: final_test_acc, final_client_acc, best_test_acc, model_sha256, ...
    run_dir: Path  # the run directory (config.yaml, metrics.jsonl, summary.json, checkpoints/, tb/)

    def metrics(self) -> list[dict]:
        """metrics.jsonl: one dict per round (and per phase after training), `round` first."""
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _text(value) -> str:
    """A Python value as the text of a `key=value` override, read back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


def override_list(overrides: dict) -> list[str]:
    """{"seed": 1, "train__lr": 0.05, "train": {"rounds": 5}} -> ["seed=1", "train.lr=0.05", "train.rounds=5"]."""
    from .config import flatten_dict

    out = []
    for name, value in overrides.items():
        key = name.replace("__", ".")
        if "." not in key and isinstance(value, dict):  # a section: train={"rounds": 5}
            out += [f"{key}.{k}={_text(v)}" for k, v in flatten_dict(value).items()]
        else:
            out.append(f"{key}={_text(value)}")
    return out


def make_config(config=None, resume=None, **overrides):
    """The validated Config that `train` runs (nothing loaded, nothing written)."""
    from .config import Config, config_from_dict, config_to_dict, load_config

    items = override_list(overrides)
    if resume is not None:
        if config is not None:
            raise ConfigError("give either config or resume=RUN_DIR, not both (a resumed run uses its saved config)")
        from .config.resume import saved_run_config

        base, saved = saved_run_config(resume, "resume=")
        return config_from_dict(base, items, source=str(saved))
    if config is None or isinstance(config, (str, Path)):
        return load_config(None if config is None else str(config), items)
    if isinstance(config, Config):
        return config_from_dict(config_to_dict(config), items)
    if isinstance(config, dict):
        return config_from_dict(config, items)
    raise ConfigError(f"config: expected a YAML file name, a mapping of sections or None, got {type(config).__name__}")


def train(config=None, *, resume=None, overwrite: bool = False, **overrides) -> RunResult:
    """Train (or with `resume=RUN_DIR` continue) one run in this process: the run of
    `distfl train CONFIG key=value ...`. `overwrite=True` is `--overwrite`."""
    from .federation.runner import train as run

    cfg = make_config(config, resume, **overrides)
    summary = run(cfg, resume=resume is not None, overwrite=overwrite)
    return RunResult(summary, Path(cfg.output.dir))


def report(*paths, out=None, metric=None, by=None, label=None, sort=None, per_client=False, style="default",
           size=None, logx=False, logy=False) -> Path:
    """`distfl report PATHS`: the table (printed, and OUT/report.md, OUT/report.csv) and the figures;
    returns OUT. `metric`, `by`, `label`: a name or a list of them, as --metric, --by, --label; `sort`,
    `per_client`, `style`, `size` ("W,H" in inches), `logx`, `logy` as --sort, --per-client, --style,
    --size, --logx, --logy."""
    from .report import main

    def listed(value):
        return [value] if isinstance(value, str) else list(value or [])

    paths = [str(p) for p in paths]
    out = Path(out) if out is not None else (Path(paths[0]) / "report" if len(paths) == 1 else Path("report"))
    main(paths, out_dir=out, by=listed(by) or None, metrics=listed(metric), label=listed(label), sort=sort,
         per_client=per_client, style=style, size=size, logx=logx, logy=logy)
    return out
