"""`distfl bench` (`--suite runtime`, the default): simulation overhead, rank scaling and collectives of the reference FL workload.

The workload (fixed): FedAvg on Fashion-MNIST with SimpleCNN, 100 clients with Dirichlet(0.5) label
skew, 10 clients a round, 1 local epoch, batch 32, lr 0.05, one intra-op thread per process, CPU
(`--device cuda`: each rank on a GPU).

What is measured, each `repeats` times, interleaved (the order alternates between repeats), medians
reported:
  1. simulation overhead: `rounds` calls of `Trainer.run_round` in this process (world size 1, one rank)
     versus a plain PyTorch loop (same architecture and seed) over exactly the same SGD steps on exactly
     the same batches: the sample indices of every client's keyed batch stream, in order, each batch
     gathered from the training set as it is used (`harness.plain_loop`). Two plain loops: the one a
     user writes (torch.optim.SGD, zero_grad, step) and a lean one (gradients handed over, one
     `_foreach_add_` a step: distfl's plain-SGD step with nothing around it), the stricter reference of the
     5% target. Set-up, evaluation and checkpoints are outside all three timings; a round's client
     work (loading the model, seeding, batch orders, statistics, the exact sum) and server step are in.
     Each is timed in wall time and in this process's CPU time; on a shared machine the CPU time is
     the steadier of the two (other processes' time is not in it), and the 5% target is judged on it.
  2. rank scaling: `distfl train` under torchrun with 1 and with 2 processes, timed as the sum of the
     per-round `round_s` in metrics.jsonl (start-up, evaluation and checkpoints excluded); and the
     hardware ceiling of the same run: one process of the plain centralised loop alone versus two
     such processes at once (ceiling = 2 * solo / concurrent, a throughput ratio). Speedup is also
     reported as a fraction of that ceiling, the figure that carries to other machines.
  3. collectives: all_reduce calls and bytes per round (dist.COLLECTIVE_CALLS / COLLECTIVE_BYTES).
  4. privacy: the same in-process rounds under DP-FedAvg (DP_WORKLOAD: per-client clipping, one noise
     draw a round, the accountant's epsilon a round) versus the plain ones (algorithm.weighting=uniform in
     both, so the cohorts, steps and arithmetic besides DP are the same).

Subprocesses are started with `sys.executable` in a fresh temporary directory, each in its own
session, and their process groups are killed when they end or anything goes wrong, so none outlives
the bench. Each torchrun run is a fresh `distfl train` in its own run directory; the two ceiling
processes are started once (import, data loading and a warm-up outside every timing) and then told
when to run, alone or together.
The results go to a JSON file (every raw timing) and a markdown table (printed, and written beside
the JSON with the suffix .md). Speed targets live here, never in tests.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .harness import (HARNESS, InProcess, _command_line, _kill_group, _median, _popen, _run, centralised_loop,
                      fresh_model, log)

# The workload of the issue. Everything else stays at its default.
WORKLOAD = [
    "seed=0",
    "data.dataset=fmnist",
    "partition.scheme=dirichlet",
    "partition.num_clients=100",
    "partition.alpha=0.5",
    "model.name=simplecnn",
    "algorithm.name=fedavg",
    "server.optimizer=sgd",
    "server.lr=1.0",
    "train.clients_per_round=10",
    "train.local_epochs=1",
    "train.batch_size=32",
    "train.lr=0.05",
    "runtime.threads=1",
]


TARGET_OVERHEAD = 1.15  # FL wall time / the torch.optim plain loop's over the same batches, at most
TARGET_LEAN_OVERHEAD = 1.05  # FL CPU time / the lean plain loop's over the same batches, at most
TARGET_DP_OVERHEAD = 1.05  # privacy.mechanism=gaussian rounds / the same rounds without DP, at most
# DP-FedAvg on the same workload: same cohorts (random) and steps; clipping, keyed noise, the RDP accountant.
DP_WORKLOAD = ["algorithm.weighting=uniform", "privacy.mechanism=gaussian", "privacy.noise_multiplier=1.0",
               "privacy.clip_norm=1.0", "privacy.delta=1e-5"]


TARGET_SPEEDUP = 1.6  # 2 ranks versus 1, at least (the figure, for 2 real cores)


# The same target as a fraction of the ideal 2x, applied to the measured ceiling instead.
TARGET_FRACTION = TARGET_SPEEDUP / 2.0


# `distfl bench --device cuda` runs the workload on the GPU instead (set by `main`).
DEVICE = "cpu"


def workload_overrides(rounds: int, out_dir: str) -> list[str]:
    return WORKLOAD + HARNESS + [f"runtime.device={DEVICE}", f"train.rounds={rounds}", f"output.dir={out_dir}"]


def time_privacy_ops(private: InProcess, repeats: int = 200) -> dict:
    """What DP adds to a round, each piece timed alone (median of `repeats`, ms): the norm of one client's
    update (float64 accumulation), the round's noise draw, the accountant's epsilon. Free of the round's
    own variance, which on a loaded machine hides a 1 ms difference in the interleaved comparison."""
    from ..privacy.mechanism import standard_normal

    tr = private.trainer
    delta = torch.randn(tr.worker.num_params, device=tr.device) * 1e-3
    numel = tr.privacy.numel

    def median_ms(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    norm = median_ms(lambda: float(torch.linalg.vector_norm(delta, dtype=torch.float64)))
    noise = median_ms(lambda: float(standard_normal(tr.privacy.key, 1, 0, numel, tr.device)[0]))
    eps = median_ms(lambda: tr.ledger.epsilon_after(private.rounds))
    clients = private.cfg.train.clients_per_round
    return {"norm_ms_per_client": norm, "noise_ms_per_round": noise, "accountant_ms_per_round": eps,
            "ms_per_round": clients * norm + noise + eps, "clients_per_round": clients}


def time_ranks(nproc: int, config_path: str, tmp: str, tag: str) -> dict:
    """`distfl train` under torchrun with `nproc` processes; the sum of metrics.jsonl's round_s."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"ranks{nproc}_{tag}_", dir=tmp))
    from ..launch import torchrun_command

    cmd = torchrun_command(nproc, ["train", config_path, f"output.dir={run_dir}"])
    _run(cmd, str(run_dir), f"{nproc}-rank run")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    round_s = [r["round_s"] for r in rows]
    return {"total_s": sum(round_s), "round_s": round_s, "bytes_reduced": [r["bytes_reduced"] for r in rows],
            "model_sha256": summary["model_sha256"], "world_size": summary["world_size"],
            "command": " ".join(cmd)}


class CeilingWorkers:
    """Two single-threaded processes of the plain centralised loop, started once (import, data, set-up
    outside every timing) and then told when to run: one alone (solo) or both at once (pair).
    Between runs they block on stdin and use no CPU."""

    def __init__(self, spec_path: str, tmp: str, count: int = 2):
        self.procs, self.logs = [], []
        try:
            for i in range(count):
                err = open(Path(tmp) / f"ceiling{i}.stderr", "w+")
                self.logs.append(err)
                self.procs.append(_popen([sys.executable, "-m", "distfl.bench", "--ceiling-worker", spec_path],
                                         tmp, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err))
            for i in range(count):
                self._expect(i, "ready")
        except BaseException:
            self.close(kill=True)
            raise

    def _fail(self, i: int, what: str):
        self.logs[i].seek(0)
        raise RuntimeError(f"bench: ceiling worker {i} {what}: {self.logs[i].read()[-4000:]}")

    def _expect(self, i: int, word: str) -> str:
        line = self.procs[i].stdout.readline()
        if not line or (word and line.strip() != word):
            self._fail(i, f"said {line!r}, expected {word or 'a result'!r}")
        return line

    def run(self, which: list[int]) -> list[float]:
        """Start the loop in the workers `which` at the same moment; each one's loop time."""
        for i in which:
            self.procs[i].stdin.write("go\n")
        for i in which:
            self.procs[i].stdin.flush()
        return [json.loads(self._expect(i, ""))["loop_s"] for i in which]

    def close(self, kill: bool = False) -> None:
        """End the workers: EOF on stdin (they exit), or at once with `kill` (after an error)."""
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            if not kill:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(p)
        for f in self.logs:
            f.close()


def ceiling_worker(spec_path: str) -> int:
    """Entry of one ceiling process: load and set up, say ready; then for every `go` line on stdin,
    train a fresh model with the plain loop and print the loop time; exit at EOF."""
    from .. import dist
    from ..config import load_config
    from ..data.datasets import load_dataset

    spec = json.loads(Path(spec_path).read_text())
    cfg = load_config(None, spec["overrides"])
    dist.init(cfg.runtime.device, cfg.runtime.threads)
    data = load_dataset(cfg.data, cfg.seed)
    # Warm-up, as the in-process measurement has one.
    centralised_loop(fresh_model(cfg, data), data.train_x, data.train_y, spec["warmup_batch_sizes"],
                     cfg.train.lr, cfg.seed)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            return 1
        model = fresh_model(cfg, data)
        loop_s = centralised_loop(model, data.train_x, data.train_y, spec["batch_sizes"], cfg.train.lr, cfg.seed)
        print(json.dumps({"loop_s": loop_s}), flush=True)
    return 0


def _fmt_bool(ok: bool) -> str:
    return "met" if ok else "**not met**"


def markdown_table(res: dict) -> str:
    o, s, c, m = res["overhead"], res["scaling"], res["collectives"], res["medians"]
    rows = [
        ("Simulation overhead: FL / plain loop with torch.optim.SGD (ratio of medians)",
         f"{o['ratio_of_medians']:.3f} (per repeat {', '.join(f'{r:.3f}' for r in o['per_repeat'])})",
         f"<= {TARGET_OVERHEAD}", _fmt_bool(o["met"])),
        ("FL rounds / lean plain loop (gradients handed over, one _foreach_add_ a step), CPU time (ratio of medians)",
         f"{o['lean_ratio_of_medians']:.3f} (per repeat {', '.join(f'{r:.3f}' for r in o['lean_per_repeat'])}; "
         f"wall time {o['lean_wall_ratio_of_medians']:.3f}; FL / torch.optim loop in CPU time {o['cpu_ratio_of_medians']:.3f})",
         f"<= {TARGET_LEAN_OVERHEAD}", _fmt_bool(o["lean_met"])),
        ("FL rounds in-process, 1 process (median)", f"{m['fl_inprocess_s']:.2f} s (CPU {m['fl_inprocess_cpu_s']:.2f} s)", "", ""),
        ("Plain loop, torch.optim.SGD, the same steps on the same batches (median)",
         f"{m['centralised_s']:.2f} s (CPU {m['centralised_cpu_s']:.2f} s)", "", ""),
        ("Lean plain loop, the same steps on the same batches (median)",
         f"{m['plain_lean_s']:.2f} s (CPU {m['plain_lean_cpu_s']:.2f} s)", "", ""),
        ("Rank scaling: 1-rank / 2-rank time (torchrun, sum of round_s)",
         f"{s['speedup']:.3f}x (1 rank {m['rank1_s']:.2f} s, 2 ranks {m['rank2_s']:.2f} s)",
         f">= {TARGET_SPEEDUP}x", _fmt_bool(s["met"])),
        ("Hardware ceiling: 2 plain processes vs 1 (throughput)",
         f"{s['ceiling']:.3f}x (solo {m['ceiling_solo_s']:.2f} s, pair {m['ceiling_pair_s']:.2f} s)",
         "(measured limit)", ""),
        ("Speedup as a fraction of the ceiling", f"{s['fraction_of_ceiling']:.3f}",
         f">= {TARGET_FRACTION:.2f} (= {TARGET_SPEEDUP}/2, derived)", _fmt_bool(s["fraction_met"])),
        ("all_reduce calls per round", f"{c['calls_per_round']:g}", "== 1", _fmt_bool(c["calls_met"])),
        ("Bytes all-reduced per round (int64 fixed point)", f"{c['bytes_per_round']:,.0f}",
         f"== {c['expected_bytes_per_round']:,} (8 x (params + buffers + {c['standard_values']} + 2 checks a fixed statistic))",
         _fmt_bool(c["bytes_met"])),
        ("Same payload as fp32, for comparison", f"{c['fp32_bytes_per_round']:,}", "", ""),
        ("Model parameters (float buffers)", f"{c['num_params']:,} ({c['num_buffers']:,})", "", ""),
        ("1-rank and 2-rank final models bit-identical", str(s["bit_identical"]), "True",
         _fmt_bool(s["bit_identical"])),
    ]
    if "privacy" in res:
        d = res["privacy"]
        rows.append(("DP-FedAvg overhead: DP / plain rounds, in-process (clip, noise, accountant)",
                     f"{d['ratio_of_medians']:.3f} (DP {m['dp_s']:.2f} s, plain {m['plain_uniform_s']:.2f} s)",
                     f"<= {TARGET_DP_OVERHEAD}", _fmt_bool(d["met"])))
        ops = d["ops_timed_alone"]
        rows.append(("DP work per round timed alone: clients x norm + noise + accountant",
                     f"{ops['ms_per_round']:.2f} ms ({ops['clients_per_round']} x {ops['norm_ms_per_client']:.3f} + "
                     f"{ops['noise_ms_per_round']:.3f} + {ops['accountant_ms_per_round']:.3f}), "
                     f"{100 * d['ops_fraction_of_round']:.3f}% of a plain round", "< 5%",
                     _fmt_bool(d["ops_fraction_of_round"] < 0.05)))
    lines = ["| figure | measured | target | |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {t} | {ok} |" for a, b, t, ok in rows]
    mach = res["machine"]
    lines += ["", f"{res['workload']['rounds']} rounds x {res['workload']['repeats']} interleaved repeats, "
              f"{res['workload']['steps_total']} SGD steps per measurement; {mach['platform']}, "
              f"{mach['cpu_count']} CPUs, torch {mach['torch']}, {mach['threads']} thread(s) per process; "
              f"{res['date']}."]
    load = mach.get("loadavg_at_start")
    if load is not None:
        lines.append(f"Load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in load)}, at end "
                     f"{'/'.join(f'{x:.2f}' for x in mach['loadavg_at_end'])}; niceness {mach['niceness']}. "
                     "Other work on the machine disturbs the timings; the ratios are of interleaved runs.")
    return "\n".join(lines) + "\n"


def run_bench(rounds: int, repeats: int, out: Path, warmup: bool = True) -> dict:
    from ..federation.aggregate import STANDARD_SEGMENTS, buffer_values

    if rounds < 1 or repeats < 1:
        raise ValueError("bench: --rounds and --repeats must be at least 1")
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    raw = {k: [] for k in ("fl_inprocess_s", "fl_inprocess_round_s", "centralised_s", "plain_lean_s",
                           "fl_inprocess_cpu_s", "centralised_cpu_s", "plain_lean_cpu_s", "rank1_s",
                           "rank1_round_s", "rank2_s", "rank2_round_s", "ceiling_solo_s", "ceiling_pair_s",
                           "plain_uniform_s", "dp_s")}
    started = time.time()
    load_at_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    try:
        with tempfile.TemporaryDirectory(prefix="distfl_bench_") as tmp:
            log(f"setting up: {rounds} rounds x {repeats} repeats (loading Fashion-MNIST, partitioning)")
            tmp_dir = tmp
            ip = InProcess(rounds, workload_overrides(rounds, str(Path(tmp) / "inprocess")))
            plain = InProcess(rounds, workload_overrides(rounds, str(Path(tmp) / "plain")) + DP_WORKLOAD[:1])
            private = InProcess(rounds, workload_overrides(rounds, str(Path(tmp) / "dp")) + DP_WORKLOAD)
            cfg = ip.cfg
            steps_total = sum(len(r) for r in ip.batches)
            samples_total = sum(sum(r) for r in ip.batches)
            log(f"{steps_total} SGD steps ({samples_total} samples) per measurement"
                + ("; warming up" if warmup else "; no warm-up (--quick)"))

            # Configs for the subprocesses (data.root made absolute: they run in temp dirs).
            sub_overrides = workload_overrides(rounds, str(Path(tmp) / "unused")) + [
                f"data.root={Path(cfg.data.root).resolve()}"]
            from ..config import dump_config, load_config

            config_path = Path(tmp) / "bench.yaml"
            config_path.write_text(dump_config(load_config(None, sub_overrides)))
            spec_path = Path(tmp) / "ceiling.json"
            spec_path.write_text(json.dumps({"overrides": sub_overrides,
                                             "batch_sizes": [b for r in ip.batches for b in r],
                                             "warmup_batch_sizes": ip.batches[0] if warmup else []}))

            # Warm-up (untimed): one FL round and both plain loops over that round's batches.
            if warmup:
                ip.time_fl(rounds=1)
                ip.time_centralised(rounds=1)
                ip.time_centralised(rounds=1, step="lean")
                plain.time_fl(rounds=1)
                private.time_fl(rounds=1)
            dp_ops = time_privacy_ops(private)

            collectives = []
            rank_runs = {1: [], 2: []}

            def fl():
                r = ip.time_fl()
                if r["samples"] != samples_total:
                    raise RuntimeError(f"bench: FL rounds processed {r['samples']} samples, "
                                       f"the step list has {samples_total}")
                raw["fl_inprocess_s"].append(r["total_s"])
                raw["fl_inprocess_cpu_s"].append(r["cpu_s"])
                raw["fl_inprocess_round_s"].append(r["round_s"])
                collectives.append(r)
                return f"FL in-process {r['total_s']:.2f} s (CPU {r['cpu_s']:.2f} s)"

            def central():
                s = ip.time_centralised()
                raw["centralised_s"].append(s["wall_s"])
                raw["centralised_cpu_s"].append(s["cpu_s"])
                return f"plain loop (torch.optim) {s['wall_s']:.2f} s (CPU {s['cpu_s']:.2f} s)"

            def lean():
                s = ip.time_centralised(step="lean")
                raw["plain_lean_s"].append(s["wall_s"])
                raw["plain_lean_cpu_s"].append(s["cpu_s"])
                return f"lean plain loop {s['wall_s']:.2f} s (CPU {s['cpu_s']:.2f} s)"

            def ranks(n):
                def go():
                    r = time_ranks(n, str(config_path), tmp, f"r{rep}")
                    raw[f"rank{n}_s"].append(r["total_s"])
                    raw[f"rank{n}_round_s"].append(r["round_s"])
                    rank_runs[n].append(r)
                    return f"{n}-rank torchrun {r['total_s']:.2f} s"
                return go

            def dp():
                a, b = plain.time_fl(), private.time_fl()
                raw["plain_uniform_s"].append(a["total_s"])
                raw["dp_s"].append(b["total_s"])
                return f"plain (uniform) {a['total_s']:.2f} s, DP {b['total_s']:.2f} s"

            def solo():
                t = ceiling.run([rep % 2])
                raw["ceiling_solo_s"].append(t[0])
                return f"ceiling solo {t[0]:.2f} s"

            def pair():
                t = ceiling.run([0, 1])
                raw["ceiling_pair_s"].append(t)
                return f"ceiling pair {t[0]:.2f} s / {t[1]:.2f} s"

            log("starting the two ceiling processes")
            ceiling = CeilingWorkers(str(spec_path), tmp)
            try:
                steps = [fl, central, lean, ranks(1), ranks(2), solo, pair, dp]
                for rep in range(repeats):
                    order = steps if rep % 2 == 0 else steps[::-1]
                    for fn in order:
                        log(f"repeat {rep + 1}/{repeats}: {fn()}")
            except BaseException:
                ceiling.close(kill=True)
                raise
            ceiling.close()

            num_params = ip.trainer.worker.num_params
            num_buffers = ip.trainer.worker.buffers.numel()
            segments = list(STANDARD_SEGMENTS) + ip.trainer.algorithm.segments()
            values = buffer_values(segments)
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)

    med = {
        "fl_inprocess_s": _median(raw["fl_inprocess_s"]),
        "centralised_s": _median(raw["centralised_s"]),
        "plain_lean_s": _median(raw["plain_lean_s"]),
        "fl_inprocess_cpu_s": _median(raw["fl_inprocess_cpu_s"]),
        "centralised_cpu_s": _median(raw["centralised_cpu_s"]),
        "plain_lean_cpu_s": _median(raw["plain_lean_cpu_s"]),
        "rank1_s": _median(raw["rank1_s"]),
        "rank2_s": _median(raw["rank2_s"]),
        "ceiling_solo_s": _median(raw["ceiling_solo_s"]),
        "ceiling_pair_s": _median([max(p) for p in raw["ceiling_pair_s"]]),
        "plain_uniform_s": _median(raw["plain_uniform_s"]),
        "dp_s": _median(raw["dp_s"]),
    }
    dp_ratio = med["dp_s"] / med["plain_uniform_s"]
    overhead_per = [f / c for f, c in zip(raw["fl_inprocess_s"], raw["centralised_s"])]
    overhead = med["fl_inprocess_s"] / med["centralised_s"]
    lean_wall_per = [f / c for f, c in zip(raw["fl_inprocess_s"], raw["plain_lean_s"])]
    lean_wall = med["fl_inprocess_s"] / med["plain_lean_s"]
    lean_per = [f / c for f, c in zip(raw["fl_inprocess_cpu_s"], raw["plain_lean_cpu_s"])]
    lean_overhead = med["fl_inprocess_cpu_s"] / med["plain_lean_cpu_s"]
    optim_cpu = med["fl_inprocess_cpu_s"] / med["centralised_cpu_s"]
    speedup_per = [a / b for a, b in zip(raw["rank1_s"], raw["rank2_s"])]
    speedup = med["rank1_s"] / med["rank2_s"]
    ceiling_per = [2 * s / max(p) for s, p in zip(raw["ceiling_solo_s"], raw["ceiling_pair_s"])]
    ceiling = 2 * med["ceiling_solo_s"] / med["ceiling_pair_s"]
    calls = [c["all_reduce_calls"] / rounds for c in collectives]
    nbytes = [c["all_reduce_bytes"] / rounds for c in collectives]
    expected_bytes = 8 * values
    rank2_bytes = sorted({b for r in rank_runs[2] for b in r["bytes_reduced"]})
    shas = {r["model_sha256"] for n in (1, 2) for r in rank_runs[n]}

    res = {
        "bench": "distfl bench",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": _command_line(),
        "args": {"rounds": rounds, "repeats": repeats, "out": str(out), "warmup": warmup},
        "elapsed_s": round(time.time() - started, 1),
        "tmp_dir": tmp_dir,  # removed at the end; every subprocess ran inside it
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "torch": torch.__version__,
            "threads": cfg.runtime.threads,
            "device": cfg.runtime.device,
            # Other work on the machine disturbs every timing: the 1/5/15-minute load averages.
            "loadavg_at_start": load_at_start,
            "loadavg_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "niceness": os.nice(0) if hasattr(os, "nice") else None,
        },
        "workload": {
            "overrides": WORKLOAD + [f"runtime.device={DEVICE}"], "harness": HARNESS, "rounds": rounds, "repeats": repeats,
            "steps_per_round": [len(r) for r in ip.batches], "samples_per_round": [sum(r) for r in ip.batches],
            "steps_total": steps_total, "samples_total": samples_total,
            "order": "per repeat: FL in-process, plain loop (torch.optim), lean plain loop, 1-rank, 2-rank, ceiling solo, ceiling pair, "
                     "plain (uniform) then DP in-process; "
                     "reversed on every other repeat",
        },
        "raw": raw,
        "medians": med,
        "overhead": {"ratio_of_medians": overhead, "per_repeat": overhead_per, "target": TARGET_OVERHEAD,
                     "met": overhead <= TARGET_OVERHEAD,
                     "lean_ratio_of_medians": lean_overhead, "lean_per_repeat": lean_per,
                     "lean_measure": "CPU time of this process (time.process_time)",
                     "lean_wall_ratio_of_medians": lean_wall, "lean_wall_per_repeat": lean_wall_per,
                     "cpu_ratio_of_medians": optim_cpu,
                     "lean_target": TARGET_LEAN_OVERHEAD, "lean_met": lean_overhead <= TARGET_LEAN_OVERHEAD},
        "scaling": {
            "speedup": speedup, "per_repeat": speedup_per, "target_speedup": TARGET_SPEEDUP,
            "met": speedup >= TARGET_SPEEDUP,
            "ceiling": ceiling, "ceiling_per_repeat": ceiling_per,
            "ceiling_definition": "2 * solo loop time / max(loop times of two concurrent processes)",
            "fraction_of_ceiling": speedup / ceiling, "fraction_target": TARGET_FRACTION,
            "fraction_met": speedup / ceiling >= TARGET_FRACTION,
            "bit_identical": len(shas) == 1, "model_sha256": sorted(shas),
            "torchrun_command": rank_runs[2][0]["command"],
        },
        "privacy": {"overrides": DP_WORKLOAD, "ops_timed_alone": dp_ops,
                    "ops_fraction_of_round": dp_ops["ms_per_round"] / 1e3 / (med["plain_uniform_s"] / rounds),
                    "ratio_of_medians": dp_ratio, "target": TARGET_DP_OVERHEAD,
                    "per_repeat": [d / p for d, p in zip(raw["dp_s"], raw["plain_uniform_s"])],
                    "met": dp_ratio <= TARGET_DP_OVERHEAD},
        "collectives": {
            "calls_per_round": calls[0] if len(set(calls)) == 1 else calls,
            "calls_per_round_each_repeat": calls,
            "calls_met": all(c == 1 for c in calls),
            "bytes_per_round": nbytes[0] if len(set(nbytes)) == 1 else nbytes,
            "bytes_per_round_each_repeat": nbytes,
            "bytes_per_round_2rank_metrics": rank2_bytes,
            "expected_bytes_per_round": expected_bytes,
            "bytes_met": all(b == expected_bytes for b in nbytes) and rank2_bytes == [expected_bytes],
            "num_params": num_params, "num_buffers": num_buffers,
            "standard_values": sum(s.numel for s in STANDARD_SEGMENTS),
            "values_per_round": values,
            "segments": {s.name: s.numel for s in segments},
            "dtype": "int64 fixed point (federation/aggregate.py)",
            "fp32_bytes_per_round": 4 * values,
            "fp32_bytes_params_only": 4 * num_params,
        },
    }
    res["table_markdown"] = markdown_table(res)
    return res
