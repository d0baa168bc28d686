"""`distfl bench`: speed and memory targets live here, never in tests. One module a suite, beside a
shared harness (harness.py):

  runtime (default)  simulation overhead, rank scaling and collectives of the reference workload (runtime.py)
  cross-device       pfl-research's cross-device shape: one client at a time versus packs, the exact
                     sum's cost, pfl-research beside it (cross_device.py)
  ffc, tct           a paper method's extra phases against a training round (ffc.py, tct.py)
  startup            where a short run's time goes that is not training (startup.py)
  system             the virtual clock's cost per round and the async schedule's rate (system.py)
  privacy            seconds to draw a million parameters' noise, secret (AES-128-CTR) and keyed, and a
                     secret cohort (privacy.py)
  compression        each compressor's cost per client per million parameters, alone and in packs (compression.py)
  lora               memory and seconds per round of LoRA rounds (fedit, stack) against full fine-tuning of
                     the same model, one client at a time and in packs (lora.py)
  whole-run          training seconds of whole runs: pfl-research's CIFAR-10 benchmark config and the
                     quickstart (whole_run.py)

Each writes JSON with every raw timing and a markdown table beside it (bench/results/<suite>.json and .md;
the runtime suite: bench/results/results.json).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import threading
from pathlib import Path

from ..errors import ConfigError
from .harness import _command_line, log


SUITES = ("runtime", "ffc", "tct", "cross-device", "startup", "system", "privacy", "whole-run", "compression", "lora")


def _raise_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _write(res: dict, table: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table, end="")
    log(f"wrote {out} and {out.with_suffix('.md')}")


def main_suite(args) -> int:
    """`--suite ffc|tct`: a paper method's extra phase; `--suite cross-device`: packs of clients;
    `--suite startup`: what a run spends outside training."""
    import torch

    from . import compression, cross_device, ffc, lora, privacy, startup, system, tct, whole_run

    quick = getattr(args, "quick", False)
    rounds = _rounds(args)
    suite = args.suite
    extra = tuple(getattr(args, "overrides", ()))
    if extra and suite not in ("cross-device", "whole-run"):
        raise ConfigError(f"distfl bench: KEY=VALUE overrides ({' '.join(extra)}) apply to the cross-device "
                          f"and whole-run suites only, not --suite {suite}")
    repeats = 1 if quick else int(args.repeats)
    out = Path(args.out) if args.out != "bench/results/results.json" else Path(f"bench/results/{suite}.json")
    module = {"cross-device": cross_device, "ffc": ffc, "tct": tct, "startup": startup, "system": system,
              "privacy": privacy, "whole-run": whole_run, "compression": compression, "lora": lora}[suite]
    if suite == "startup":
        res = startup.bench(repeats, log, 2 if quick else rounds)
    elif suite == "cross-device":
        res = cross_device.bench_cross_device(1 if quick else rounds, repeats, log,
                                              getattr(args, "device", None),
                                              cross_device.pack_sizes(getattr(args, "pack_sizes", "1,10")),
                                              cross_device.counts(getattr(args, "pfl_processes", "1"), "--pfl-processes"),
                                              cross_device.counts(getattr(args, "ranks", ""), "--ranks"), extra)
    elif suite == "whole-run":
        res = whole_run.bench(2 if quick else getattr(args, "rounds", None), log, getattr(args, "device", None), extra)
    elif suite == "lora":
        res = lora.bench(2 if quick else rounds, repeats, log)
    elif suite in ("tct", "privacy", "compression"):
        res = module.bench(repeats, log, getattr(args, "device", None))
    else:
        res = module.bench(repeats, log)
    res.update(bench=f"distfl bench --suite {suite}", command=_command_line(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               machine={"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None})
    _write(res, module.markdown(res), out)
    return 0


def _rounds(args) -> int:
    """--rounds, 10 when not given (the whole-run suite reads None as each run's own number of rounds)."""
    return 10 if getattr(args, "rounds", None) is None else int(args.rounds)


def main(args) -> int:
    if getattr(args, "suite", "runtime") != "runtime" or getattr(args, "overrides", None):
        return main_suite(args)
    from . import runtime

    runtime.DEVICE = getattr(args, "device", None) or "cpu"
    quick = bool(getattr(args, "quick", False))
    rounds = 2 if quick else _rounds(args)
    repeats = 1 if quick else int(args.repeats)
    out = Path(args.out)
    # SIGTERM unwinds like Ctrl-C, so the `finally` blocks kill the subprocesses the bench started.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        res = runtime.run_bench(rounds, repeats, out, warmup=not quick)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    res["args"]["quick"] = quick
    print()
    _write(res, res["table_markdown"], out)
    return 0
