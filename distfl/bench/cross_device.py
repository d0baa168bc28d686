"""`distfl bench --suite cross-device`: seconds per round, one client at a time versus packs.

The shape of pfl-research's CIFAR-10 cross-device benchmark: 1,000 clients x 50 samples, 50 clients
a round, 1 local epoch, batch 10, local lr 0.1, server lr 1 (FedAvg), its simple CNN (`pfl_cnn`:
conv32-conv64-maxpool-fc128), on synthetic 3x32x32 data of that shape (CIFAR-10 is not available
here; the cost of a round does not depend on the pixel values).

For each pack size, one in-process Trainer (world size 1, `runtime.device`: `--device`, else cuda
when available, else cpu) runs one untimed warm-up round, then `rounds` timed calls of `run_round` from the same
initial model, `repeats` times, the pack sizes interleaved (the order alternates between repeats).
Evaluation and checkpoints are outside the timing. Also recorded: how far each packed run's final
model is from the one-at-a-time one (float rounding; README "Client packs"), and, when
DISTFL_PFL_PYTHON names a Python with pfl==0.6.0, pfl-research's seconds per round on the same shape
(bench/pfl_research_cross_device.py, run in every repeat beside distfl's runs, on pfl's default device). And the
exact sum's cost alone: milliseconds per client per million parameters (`exact_sum_cost`).

`--pfl-processes 1,2,3,4,5`: pfl-research in each of those numbers of worker processes sharing the
device (its guide's advice for one GPU: try 1-5), every count in every repeat; its best count is
compared with distfl's best configuration. `--ranks 1,2,4`: `distfl train` under torchrun with that
many ranks sharing the device (gloo), in packs of the largest `--pack-sizes` value or a rank's share
of the round's clients if smaller (`rank_pack_size`), one untimed warm-up round, then `rounds` rounds
timed from metrics.jsonl's `round_s`; seconds per round, client updates per second and whether rank
counts with equal pack sizes gave bit-identical final models.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from ..errors import ConfigError

WORKLOAD = [
    "seed=0", "data.dataset=synthetic", "data.synthetic_train=50000", "data.synthetic_test=1000",
    "data.synthetic_classes=10", "data.synthetic_image_size=32", "data.synthetic_channels=3",
    "partition.scheme=iid", "partition.num_clients=1000", "model.name=pfl_cnn", "algorithm.name=fedavg",
    "server.optimizer=sgd", "server.lr=1.0", "train.clients_per_round=50", "train.local_epochs=1",
    "train.batch_size=10", "train.lr=0.1", "runtime.threads=1",
]
PACK_SIZES = (1, 10)
COHORT = 50  # pfl-research's clients a round in bench/pfl_research_cross_device.py


def pack_sizes(text: str) -> tuple[int, ...]:
    """`--pack-sizes 1,10,50` -> (1, 10, 50); the first must be 1 (the reference the rest are compared to)."""
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] != 1 or any(p < 1 for p in sizes) or len(set(sizes)) != len(sizes):
        raise ConfigError(f"--pack-sizes {text!r}: expected distinct positive integers starting with 1, e.g. 1,10,50")
    return sizes
# pfl-research 0.6 cannot live in distfl's environment; a Python that has it (pip install pfl==0.6.0,
# with torch) named here runs bench/pfl_research_cross_device.py on the same shape, after distfl's runs.
PFL_PYTHON_ENV = "DISTFL_PFL_PYTHON"


def counts(text: str, flag: str) -> tuple[int, ...]:
    """`--pfl-processes 1,2,3` or `--ranks 1,2,4` -> (1, 2, 3); empty text -> () (not measured)."""
    try:
        values = tuple(int(v) for v in text.split(",")) if text else ()
    except ValueError:
        values = (0,)
    if any(v < 1 for v in values) or len(set(values)) != len(values):
        raise ConfigError(f"{flag} {text!r}: expected distinct positive integers, e.g. 1,2,4")
    return values


def pfl_research(rounds: int, log, processes: int = 1) -> dict | str:
    python = os.environ.get(PFL_PYTHON_ENV)
    if not python:
        return f"not measured (set {PFL_PYTHON_ENV} to a Python with pfl==0.6.0 and torch installed)"
    script = Path(__file__).resolve().parents[2] / "bench" / "pfl_research_cross_device.py"
    cmd = [python, str(script), "--rounds", str(rounds), "--processes", str(processes)]
    log(f"pfl-research 0.6: {' '.join(cmd[1:])}")
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        # The script's own last word ("pfl worker R of N failed ...") if it said one: torch's warnings at exit come after it.
        lines = proc.stderr.strip().splitlines()
        said = [line for line in lines if line.startswith("pfl worker")] or lines[-3:]
        return f"not measured ({script.name} --processes {processes} failed: {said[-1][:1500] if said else 'no output'})"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_ranks(nproc: int, overrides: list[str], rounds: int, tmp: str) -> dict:
    """`distfl train` under torchrun with `nproc` ranks: round 1 untimed, then `rounds` rounds' round_s."""
    from ..launch import torchrun_command
    from .harness import _run, write_config

    run_dir = Path(tempfile.mkdtemp(prefix=f"ranks{nproc}_", dir=tmp))
    config = write_config(run_dir / "bench.yaml", overrides + [f"train.rounds={rounds + 1}",
                                                               f"output.dir={run_dir / 'run'}"])
    cmd = torchrun_command(nproc, ["train", str(config)])
    _run(cmd, str(run_dir), f"{nproc}-rank run")
    rows = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "run" / "summary.json").read_text())
    return {"s_per_round": statistics.mean(r["round_s"] for r in rows[1:]), "warmup_round_s": rows[0]["round_s"],
            "model_sha256": summary["model_sha256"], "world_size": summary["world_size"],
            "pack_size": summary["pack_size"]}


def exact_sum_cost(num_params: int, clients: int, repeats: int, device: torch.device) -> dict:
    """Milliseconds one client's update of `num_params` float32 values costs the exact sum
    (federation/aggregate.py: StatBuffer.add, and its share of the round's conversion in `reduce`),
    per client and per million parameters; median of `repeats` rounds of `clients` clients."""
    from .. import dist
    from ..federation.aggregate import Segment, StatBuffer

    ctx = dist.DistContext(rank=0, world_size=1, local_rank=0, device=device, backend=None)
    generator = torch.Generator().manual_seed(0)
    updates = [(torch.randn(num_params, generator=generator) * 1e-3).to(device) for _ in range(4)]
    per_client = []
    for _ in range(repeats + 1):  # the first round warms up
        stats = StatBuffer([Segment("delta", num_params)], device, clients)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for k in range(clients):
            stats.add("delta", updates[k % 4], 1.0 / clients)
        stats.reduce(ctx, name="bench")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        per_client.append((time.perf_counter() - start) / clients)
    ms = 1000 * statistics.median(per_client[1:])
    return {"num_params": num_params, "clients": clients, "ms_per_client": ms,
            "ms_per_client_per_mparam": ms / (num_params / 1e6)}


def bench_cross_device(rounds: int, repeats: int, log, device: str | None = None,
                       sizes: tuple[int, ...] = PACK_SIZES, pfl_processes: tuple[int, ...] = (1,),
                       ranks: tuple[int, ...] = (), extra: tuple[str, ...] = ()) -> dict:
    """`extra`: overrides added to every distfl run (`distfl bench ... KEY=VALUE`)."""
    from ..federation.local import local_steps
    from .harness import HARNESS, InProcess

    placed = [f"runtime.device={device}"] if device else []
    with tempfile.TemporaryDirectory(prefix="distfl_bench_xdev_") as tmp:
        runs = {}
        for p in sizes:
            overrides = WORKLOAD + placed + HARNESS + [*extra, f"train.rounds={rounds}", f"runtime.pack_size={p}",
                                                       f"output.dir={tmp}/pack{p}"]
            runs[p] = InProcess(rounds, overrides)
            log(f"pack_size={p}: warm-up round (untimed)")
            runs[p].time_fl(1)
        ranked = WORKLOAD + placed + HARNESS + [*extra, f"data.root={Path(runs[1].cfg.data.root).resolve()}"]
        cohort = runs[1].cfg.train.clients_per_round
        rank_packs = {n: rank_pack_size(max(sizes), cohort, n) for n in ranks}
        per_round = {p: [] for p in sizes}
        pfl_runs: dict = {n: [] for n in pfl_processes}  # run between distfl's in every repeat (same load)
        rank_runs: dict = {n: [] for n in ranks}
        for rep in range(repeats):
            order = [*sizes, *(("ranks", n) for n in ranks), *(("pfl", n) for n in pfl_processes)]
            for p in order if rep % 2 == 0 else reversed(order):
                if isinstance(p, tuple) and p[0] == "pfl":
                    pfl_runs[p[1]].append(pfl_research(rounds, log, p[1]))
                    continue
                if isinstance(p, tuple):
                    n = p[1]
                    rank_runs[n].append(time_ranks(n, ranked + [f"runtime.pack_size={rank_packs[n]}"], rounds, tmp))
                    log(f"repeat {rep + 1}/{repeats}: {n} rank(s), packs of {rank_packs[n]}: "
                        f"{rank_runs[p[1]][-1]['s_per_round']:.3f} s/round")
                    continue
                res = runs[p].time_fl(rounds)
                per_round[p].append(statistics.mean(res["round_s"]))
                log(f"repeat {rep + 1}/{repeats}: pack_size={p}: {per_round[p][-1]:.3f} s/round")
        reference = runs[1].trainer.global_params
        diff = {p: float((runs[p].trainer.global_params - reference).abs().max()) for p in sizes}
        device = str(runs[1].trainer.device)
        train = runs[1].cfg.train
        per_client = int(runs[1].trainer.population.sizes.max())  # iid: every client holds the same
        steps = rounds * train.clients_per_round * local_steps(per_client, train.batch_size, train.local_epochs, train.local_steps)
        exact_sum = exact_sum_cost(runs[1].trainer.worker.num_params, train.clients_per_round, max(3, repeats),
                                   runs[1].trainer.device)
        log(f"exact sum: {exact_sum['ms_per_client']:.2f} ms a client "
            f"({exact_sum['ms_per_client_per_mparam']:.2f} ms per million parameters)")
    median = {p: statistics.median(v) for p, v in per_round.items()}
    pfl = {str(n): _pfl_summary(r, median[1]) for n, r in pfl_runs.items()}
    shared = _ranks_summary(rank_runs, train.clients_per_round, rank_packs if ranks else {})
    return {
        "extra_overrides": list(extra),
        "exact_sum": exact_sum,
        "workload": WORKLOAD, "rounds": rounds, "repeats": repeats, "device": device,
        "gpu": torch.cuda.get_device_name(runs[1].trainer.device) if device.startswith("cuda") else None,
        "torch_threads": torch.get_num_threads(),
        "s_per_round": {str(p): v for p, v in per_round.items()},
        "median_s_per_round": {str(p): v for p, v in median.items()},
        "ms_per_client_step": {str(p): 1000 * median[p] * rounds / steps for p in sizes},
        "speedup_vs_pack_1": {str(p): median[1] / median[p] for p in sizes},
        "max_abs_diff_vs_pack_1": {str(p): v for p, v in diff.items()},
        "clients_per_round": train.clients_per_round,
        "client_updates_per_s": {str(p): train.clients_per_round / median[p] for p in sizes},
        # pfl-research in 1 process (the column beside each pack size), and in every --pfl-processes count
        "pfl_research_0.6": pfl.get("1", "not measured (--pfl-processes without 1)"),
        "pfl_research_processes": pfl,
        "ranks_sharing_device": shared,
        "best": _best(median, shared, pfl),
    }


def rank_pack_size(largest: int, clients_per_round: int, ranks: int) -> int:
    """The pack size `--ranks` runs `ranks` ranks with: the largest `--pack-sizes` value, but at most a
    rank's share of the round's clients. Packs are cut from the cohort whatever the world size and dealt
    whole to ranks, so packs bigger than a share would leave ranks without work."""
    return min(largest, -(-clients_per_round // ranks))


def _ranks_summary(rank_runs: dict, clients_per_round: int, pack_sizes: dict) -> dict | None:
    if not rank_runs:
        return None
    med = {n: statistics.median(r["s_per_round"] for r in runs) for n, runs in rank_runs.items()}
    # Equal pack sizes must give equal models on any number of ranks; other pack sizes round differently.
    shas = {}
    for n, runs in rank_runs.items():
        shas.setdefault(pack_sizes[n], set()).update(r["model_sha256"] for r in runs)
    return {"pack_size": {str(n): p for n, p in pack_sizes.items()}, "backend": "gloo (ranks share the device)",
            "median_s_per_round": {str(n): v for n, v in med.items()},
            "s_per_round_each_repeat": {str(n): [r["s_per_round"] for r in runs] for n, runs in rank_runs.items()},
            "client_updates_per_s": {str(n): clients_per_round / v for n, v in med.items()},
            "bit_identical_at_equal_pack_size": all(len(v) == 1 for v in shas.values()),
            "model_sha256_by_pack_size": {str(p): sorted(v) for p, v in shas.items()}}


def _best(median: dict, shared: dict | None, pfl: dict) -> dict:
    """distfl's fastest configuration (a pack size in one process, or a rank count) against pfl-research's
    fastest process count: the speed-up, pfl-research's s / round over distfl's."""
    ours = {f"pack_size={p}": v for p, v in median.items()}
    if shared:
        ours.update({f"{n} ranks, pack_size={shared['pack_size'][n]}": v
                     for n, v in shared["median_s_per_round"].items()})
    name = min(ours, key=ours.get)
    theirs = {n: r["s_per_round"] for n, r in pfl.items() if isinstance(r, dict)}
    out = {"distfl": name, "distfl_s_per_round": ours[name]}
    if theirs:
        n = min(theirs, key=theirs.get)
        out.update(pfl_processes=int(n), pfl_s_per_round=theirs[n], speedup_vs_pfl=theirs[n] / ours[name])
    return out


def _pfl_summary(runs: list, distfl_median: float):
    """pfl-research's repeats (or why it was not measured), their median and distfl pack_size=1's ratio."""
    measured = [r for r in runs if isinstance(r, dict)]
    if not measured:
        return runs[0] if runs else "not measured"
    median = statistics.median(r["s_per_round"] for r in measured)
    return {**measured[0], "s_per_round": median, "s_per_round_each_repeat": [r["s_per_round"] for r in measured],
            "distfl_pack1_over_pfl": distfl_median / median}


def markdown(res: dict) -> str:
    lines = [
        f"# distfl bench --suite cross-device ({res['date']})", "",
        "pfl-research's CIFAR-10 shape: 1,000 clients x 50 samples, 50 a round, 1 epoch, batch 10, lr 0.1, "
        "server lr 1, pfl_cnn; synthetic 3x32x32 data.", "",
        f"Command: `{res['command']}`. Device: {res['device']}{f' ({gpu})' if (gpu := res.get('gpu')) else ''}, "
        f"{res['torch_threads']} thread(s); "
        f"{res['rounds']} rounds x {res['repeats']} repeat(s), medians; load average {res['machine']['loadavg']}.",
        "",
        "| pack_size | s / round | ms / client step | speed-up vs pack_size=1 | speed vs pfl-research | "
        "max abs diff of the final model vs pack_size=1 |",
        "|---|---|---|---|---|---|",
    ]
    pfl = res["pfl_research_0.6"]
    for p in res["median_s_per_round"]:
        versus = f"{pfl['s_per_round'] / res['median_s_per_round'][p]:.2f}x" if isinstance(pfl, dict) else "-"
        lines.append(f"| {p} | {res['median_s_per_round'][p]:.3f} | {res['ms_per_client_step'][p]:.3f} | "
                     f"{res['speedup_vs_pack_1'][p]:.2f}x | {versus} | {res['max_abs_diff_vs_pack_1'][p]:.2e} |")
    exact = res.get("exact_sum")
    if exact:
        lines += ["", f"Exact sum (StatBuffer.add and its share of `reduce`): {exact['ms_per_client']:.2f} ms a client "
                  f"of {exact['num_params']:,} parameters = **{exact['ms_per_client_per_mparam']:.2f} ms per client per "
                  "million parameters**."]
    if isinstance(pfl, dict):
        pfl = (f"{pfl['s_per_round']:.3f} s / round, median of {len(pfl.get('s_per_round_each_repeat', [1]))} "
               f"repeats interleaved with distfl's ({pfl['rounds']} rounds after a warm-up round, 1 thread, torch "
               f"{pfl['torch']}; distfl's torch {res['machine']['torch']}; bench/pfl_research_cross_device.py). "
               f"**distfl pack_size=1 / pfl-research = {pfl['distfl_pack1_over_pfl']:.2f}**")
    lines += ["", f"pfl-research 0.6 on the same shape: {pfl}.", ""]
    counts = {n: r for n, r in res.get("pfl_research_processes", {}).items() if isinstance(r, dict)}
    if len(counts) > 1 or set(counts) - {"1"}:
        backend = {r.get("backend") for r in counts.values()} - {None}
        lines += [f"pfl-research in several worker processes sharing the device (PFL_WORKER_ADDRESSES, "
                  f"process group {', '.join(sorted(backend)) or 'none'}):", "",
                  "| processes | s / round | client updates / s |", "|---|---|---|"]
        lines += [f"| {n} | {r['s_per_round']:.3f} | {r.get('cohort', COHORT) / r['s_per_round']:.0f} |"
                  for n, r in counts.items()]
        lines.append("")
    shared = res.get("ranks_sharing_device")
    if shared:
        lines += ["distfl ranks sharing the device (torchrun, gloo; the same final model at equal pack sizes: "
                  f"{shared['bit_identical_at_equal_pack_size']}):", "",
                  "| ranks | pack_size | s / round | client updates / s |", "|---|---|---|---|"]
        lines += [f"| {n} | {shared['pack_size'][n]} | {v:.3f} | {shared['client_updates_per_s'][n]:.0f} |"
                  for n, v in shared["median_s_per_round"].items()]
        lines.append("")
    best = res.get("best")
    if best and "speedup_vs_pfl" in best:
        lines += [f"Best of each: distfl {best['distfl']} {best['distfl_s_per_round']:.3f} s / round, pfl-research "
                  f"{best['pfl_processes']} process(es) {best['pfl_s_per_round']:.3f} s / round: "
                  f"pfl-research's time over distfl's **{best['speedup_vs_pfl']:.2f}x** (target 10x).", ""]
    return "\n".join(lines)
