"""`distfl bench --suite whole-run`: the training seconds of two whole runs, each one `distfl train`
(one process, `--device`, else cuda when available, else cpu) as a user starts it:

  cifar10     pfl-research's CIFAR-10 benchmark config: 1,000 clients x 50 samples, 50 a round, batch
              10, 1 local epoch, lr 0.1, server lr 1 (FedAvg), its CNN (`pfl_cnn`), 1,500 rounds: 75,000
              client updates. On synthetic 3x32x32 data of that shape (cross_device.WORKLOAD): CIFAR-10
              cannot be downloaded where this runs, and the cost of a round does not depend on the pixel
              values. Evaluated once, after the last round; no checkpoint before it.
  quickstart  configs/quickstart.yaml (FedAvg on Fashion-MNIST, 100 rounds, evaluated every 10).

Training seconds = the sum of metrics.jsonl's `round_s` (each round's local training, sum and update;
start-up, evaluation and checkpoints excluded); the first round, which pays CUDA's and cuDNN's
warm-up, is reported on its own too. `--rounds N` runs at most N rounds of each; the figures then also
say what the whole run would take at the measured per-round rate. `KEY=VALUE` overrides apply
to both runs (e.g. a runtime setting to compare).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from ..config import load_config
from .cross_device import WORKLOAD as CROSS_DEVICE
from .harness import HARNESS, REPO_ROOT, _run, write_config

QUICKSTART = REPO_ROOT / "configs" / "quickstart.yaml"
RUNS = {
    "cifar10": {"config": None, "rounds": 1500, "overrides": CROSS_DEVICE + HARNESS,
        # pfl-research's benchmark: 75,000 client updates in <= 75 s of training (>= 1,000 a second)
        "target": {"client_updates_per_s": 1000.0}},
    "quickstart": {"config": str(QUICKSTART), "rounds": 100, "overrides": ["output.progress=none"],
                   "target": {"training_s": 10.0}},  # the quickstart's 100 rounds in <= 10 s of training
}


def run(name: str, rounds: int | None, device: str | None, extra: tuple[str, ...], tmp: str, log) -> dict:
    """One whole run of RUNS[name] (at most `rounds` rounds) in a fresh process; its timings and results."""
    spec = RUNS[name]
    done = spec["rounds"] if rounds is None else min(rounds, spec["rounds"])
    out = Path(tmp) / name
    overrides = spec["overrides"] + list(extra) + [f"train.rounds={done}", f"output.dir={out}"] + (
        [f"runtime.device={device}"] if device else [])
    out.mkdir(parents=True)
    config = write_config(out.parent / f"{name}.yaml", overrides, spec["config"])
    cmd = [sys.executable, "-m", "distfl", "train", str(config)]
    log(f"{name}: {done} rounds: distfl train {spec['config'] or '(defaults)'} {' '.join(overrides)}")
    _run(cmd, str(REPO_ROOT), f"the {name} run")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((out / "summary.json").read_text())
    round_s = [r["round_s"] for r in rows]
    training_s = sum(round_s)
    cohort = load_config(str(config), []).train.clients_per_round  # both runs: cohorts of this fixed size
    clients = cohort * len(rows)
    res = {"rounds": done, "full_rounds": spec["rounds"], "config": config.read_text(), "round_s": round_s,
           "training_s": training_s,
           "first_round_s": round_s[0], "wall_s": summary["wall_s"], "client_updates": clients,
           "client_updates_per_s": clients / training_s,
           # at the measured per-round rate, rounds after the first (the whole run's first round is this one)
           "full_run_training_s": round_s[0] + sum(round_s[1:]) / (done - 1) * (spec["rounds"] - 1)
           if done > 1 else None,
           "final_test_acc": summary["final_test_acc"], "model_sha256": summary["model_sha256"], "device": summary["device"],
           "pack_size": summary["pack_size"], "world_size": summary["world_size"], "extra_overrides": list(extra)}
    res["target"] = spec["target"]
    res["met"] = _met(res)
    return res


def _met(res: dict) -> bool | None:
    """Whether the run meets its target; for a shortened run, judged on `full_run_training_s`."""
    full = res["full_run_training_s"] if res["rounds"] < res["full_rounds"] else res["training_s"]
    if full is None:
        return None
    target = res["target"]
    if "training_s" in target:
        return full <= target["training_s"]
    per_round = res["client_updates"] / res["rounds"]
    return per_round * res["full_rounds"] / full >= target["client_updates_per_s"]


def bench(rounds: int | None, log, device: str | None = None, extra: tuple[str, ...] = ()) -> dict:
    with tempfile.TemporaryDirectory(prefix="distfl_bench_whole_") as tmp:
        runs = {name: run(name, rounds, device, extra, tmp, log) for name in RUNS}
    gpu = None
    if any(r["device"].startswith("cuda") for r in runs.values()):
        gpu = torch.cuda.get_device_name(0)
    return {"runs": runs, "gpu": gpu, "rounds_cap": rounds}


def markdown(res: dict) -> str:
    lines = [f"# distfl bench --suite whole-run ({res['date']})", "",
             f"Command: `{res['command']}`{f'; GPU: {gpu}' if (gpu := res.get('gpu')) else ''}. Training seconds: "
             "the sum of the rounds' `round_s` (start-up and evaluation excluded). The cifar10 run is "
             "pfl-research's CIFAR-10 benchmark config on synthetic 3x32x32 data of CIFAR-10's shape.", "",
             "| run | rounds | device, pack_size | training s (first round) | client updates / s | "
             "whole run's training s | target | final test acc |", "|---|---|---|---|---|---|---|---|"]
    for name, r in res["runs"].items():
        full = r["training_s"] if r["rounds"] == r["full_rounds"] else r["full_run_training_s"]
        whole = "-" if full is None else f"{full:.1f}" + ("" if r["rounds"] == r["full_rounds"] else
                                                         f" (projected from {r['rounds']})")
        target = ", ".join(f"{k} {'<=' if k == 'training_s' else '>='} {v:g}" for k, v in r["target"].items())
        verdict = {True: "met", False: "**not met**", None: "-"}[r["met"]]
        rate = f"{r['client_updates_per_s']:.0f}"
        acc = "-" if r["final_test_acc"] is None else f"{100 * r['final_test_acc']:.2f}%"
        lines.append(f"| {name} | {r['rounds']} of {r['full_rounds']} | {r['device']}, {r['pack_size']} | "
                     f"{r['training_s']:.2f} ({r['first_round_s']:.2f}) | {rate} | {whole} | {target}: {verdict} | "
                     f"{acc} |")
    return "\n".join(lines + [""])
