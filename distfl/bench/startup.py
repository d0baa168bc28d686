"""`distfl bench --suite startup`: where a short run's time goes that is not training.

The runtime suite's workload (FMNIST, SimpleCNN, 100 clients, 10 a round; `--rounds`, default 10) is
run as `distfl train` under torchrun with 2 ranks, `repeats` times. Every rank runs a probe
(`probe.py` written to a temporary directory) that times, on its own process, the steps of a run as
`distfl train` takes them: importing torch, importing distfl's trainer, `dist.init` (process group,
deterministic kernels), decoding the dataset, partitioning, the rest of the set-up (model, algorithm,
checks, run directory), the training rounds, evaluation, TensorBoard and checkpoints; the bench adds
what only the outside sees: torchrun's agent (from the launch to the first line of the slowest rank,
and from the last rank's exit to torchrun's). Rank 0's steps are reported, medians over repeats.

Two variants, interleaved: `now` (this code) and `public_deterministic`, in which `dist.init` calls
`torch.use_deterministic_algorithms` (which imports torch._inductor and torch._dynamo) as before
the start-up work of issue "House in order": the before/after of that cut in one run.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .harness import _env, _kill_group, _popen, log

PROBE = r'''
import json, os, sys, time
T0 = time.time()
START = time.perf_counter()
spent = {}


def timed(key, fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t
    return wrapper


t = time.perf_counter()
import torch
spent["import torch"] = time.perf_counter() - t
t = time.perf_counter()
from distfl import cli, dist
from distfl.federation import runner
from distfl import logging as run_logging
spent["import distfl"] = time.perf_counter() - t
if os.environ["PROBE_VARIANT"] == "public_deterministic":
    dist.set_deterministic = lambda mode, warn_only=False: torch.use_deterministic_algorithms(mode, warn_only=warn_only)
dist.init = timed("process group + deterministic kernels (dist.init)", dist.init)
runner.load_dataset = timed("dataset decode", runner.load_dataset)
runner.partition = timed("partition", runner.partition)
init = runner.Trainer.__init__
runner.Trainer.__init__ = timed("set-up (all)", init)
runner.Trainer.run_round = timed("training rounds", runner.Trainer.run_round)
runner.Trainer.evaluate_round = timed("evaluation", runner.Trainer.evaluate_round)
runner.Trainer.save_checkpoint = timed("checkpoints", runner.Trainer.save_checkpoint)
logger_init = run_logging.RunLogger.__init__
run_logging.RunLogger.__init__ = timed("TensorBoard writer + logs", logger_init)
run_logging.RunLogger.log_round = timed("TensorBoard writer + logs", run_logging.RunLogger.log_round)
code = cli.main(sys.argv[1:])
spent["process (from the probe's first line)"] = time.perf_counter() - START
with open(os.path.join(os.environ["PROBE_OUT"], f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
    json.dump({"spent": spent, "first_line": T0, "last_line": time.time(), "code": code}, f)
sys.exit(code)
'''

VARIANTS = ("now", "public_deterministic")


def _one(variant: str, rounds: int, tmp: Path, tag: str) -> dict:
    from .runtime import WORKLOAD

    out = tmp / f"{variant}_{tag}"
    out.mkdir()
    (tmp / "probe.py").write_text(PROBE)
    config = tmp / "workload.yaml"
    config.write_text("seed: 0\n")
    overrides = WORKLOAD + ["runtime.device=cpu", f"train.rounds={rounds}", f"output.dir={out / 'run'}",
                            "output.progress=none", "eval.every=5", "checkpoint.every=5"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(tmp / "probe.py"), "train", str(config), *overrides]
    env = {**_env(), "PROBE_OUT": str(out), "PROBE_VARIANT": variant}
    launched = time.time()
    proc = _popen(cmd, str(out), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        text, _ = proc.communicate(timeout=3600)
    finally:
        _kill_group(proc)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"bench startup: {' '.join(cmd)} failed:\n{text[-3000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    steps = dict(ranks[0]["spent"])
    steps["torchrun agent (launch to the ranks' first line, last exit to its own)"] = (
        max(r["first_line"] for r in ranks) - launched + ended - max(r["last_line"] for r in ranks))
    steps["whole command (outside)"] = ended - launched
    set_up = steps.pop("set-up (all)")
    steps["set-up: the rest (model, algorithm, checks, run directory)"] = (
        set_up - steps.get("dataset decode", 0.0) - steps.get("partition", 0.0))
    return steps


def bench(repeats: int, log_fn=log, rounds: int = 10) -> dict:
    raw = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="distfl_bench_startup_") as tmp:
        for rep in range(repeats):
            for variant in VARIANTS if rep % 2 == 0 else reversed(VARIANTS):
                steps = _one(variant, rounds, Path(tmp), str(rep))
                raw[variant].append(steps)
                log_fn(f"repeat {rep + 1}/{repeats} {variant}: {steps['whole command (outside)']:.2f} s, "
                       f"dist.init {steps['process group + deterministic kernels (dist.init)']:.2f} s")
    medians = {v: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for v, rows in raw.items()}
    return {"rounds": rounds, "repeats": repeats, "raw": raw, "median_s": medians}


ORDER = ("import torch", "import distfl", "process group + deterministic kernels (dist.init)", "dataset decode",
         "partition", "set-up: the rest (model, algorithm, checks, run directory)", "training rounds",
         "evaluation", "TensorBoard writer + logs", "checkpoints", "process (from the probe's first line)",
         "torchrun agent (launch to the ranks' first line, last exit to its own)", "whole command (outside)")


def markdown(res: dict) -> str:
    now, before = res["median_s"]["now"], res["median_s"]["public_deterministic"]
    lines = [f"# distfl bench --suite startup ({res['date']})", "",
             f"The runtime workload, {res['rounds']} rounds, `distfl train` under torchrun with 2 ranks; rank 0's "
             f"steps, medians of {res['repeats']} interleaved repeats. Command: `{res['command']}`; load average "
             f"{res['machine']['loadavg']}.", "",
             "| step | now (s) | with torch.use_deterministic_algorithms (s) |", "|---|---|---|"]
    for key in ORDER:
        if key in now:
            lines.append(f"| {key} | {now[key]:.2f} | {before.get(key, float('nan')):.2f} |")
    not_training = now["whole command (outside)"] - now.get("training rounds", 0.0)
    lines += ["", f"Not training: {not_training:.2f} s of {now['whole command (outside)']:.2f} s "
              f"(before: {before['whole command (outside)'] - before.get('training rounds', 0.0):.2f} s of "
              f"{before['whole command (outside)']:.2f} s).", ""]
    return "\n".join(lines)
