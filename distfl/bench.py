"""`distfl bench`: simulation overhead, rank scaling and collectives of the reference FL workload.

The workload (fixed): FedAvg on Fashion-MNIST with SimpleCNN, 100 clients with Dirichlet(0.5) label
skew, 10 clients a round, 1 local epoch, batch 32, lr 0.05, one intra-op thread per process, CPU.

What is measured, each `repeats` times, interleaved (the order alternates between repeats), medians
reported:
  1. simulation overhead: `rounds` calls of `Trainer.run_round` in this process (world size 1)
     versus a plain centralised loop (same architecture and seed, torch.optim.SGD) doing exactly the
     same number of SGD steps with exactly the same batch sizes, batches drawn from the whole
     training set. Set-up, evaluation and checkpoints are outside both timings.
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

import copy
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

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
    "runtime.device=cpu",
    "runtime.threads=1",
]
# Bench-only settings: no evaluation before the last round, no checkpoints before the last round,
# no TensorBoard, no progress output.
HARNESS = [
    "eval.every=1000000",
    "checkpoint.every=0",
    "output.tensorboard=false",
    "output.progress=none",
]

TARGET_OVERHEAD = 1.15  # FL wall time / centralised wall time, at most
TARGET_DP_OVERHEAD = 1.05  # privacy.mechanism=gaussian rounds / the same rounds without DP, at most
# DP-FedAvg on the same workload: same cohorts (random) and steps; clipping, keyed noise, the RDP accountant.
DP_WORKLOAD = ["algorithm.weighting=uniform", "privacy.mechanism=gaussian", "privacy.noise_multiplier=1.0",
               "privacy.clip_norm=1.0", "privacy.delta=1e-5"]
TARGET_SPEEDUP = 1.6  # 2 ranks versus 1, at least (the figure, for 2 real cores)
# The same target as a fraction of the ideal 2x, applied to the measured ceiling instead.
TARGET_FRACTION = TARGET_SPEEDUP / 2.0
SUBPROCESS_TIMEOUT_S = 1800

REPO_ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the workload ------------------------------------------------------------------------------

def workload_overrides(rounds: int, out_dir: str) -> list[str]:
    return WORKLOAD + HARNESS + [f"train.rounds={rounds}", f"output.dir={out_dir}"]


def batch_sizes_of_rounds(population, cfg, rounds: int) -> list[list[int]]:
    """Per round, the batch sizes of every local SGD step the round's clients take, in order.

    The cohorts are the runner's (Population.cohort with the config's seed, size and rule); a client
    with n samples takes the batches of `federation.local.batch_sizes` (ceil(n / batch) an epoch, the last
    one partial, or train.local_steps of them).
    """
    from .federation.local import batch_sizes

    tc = cfg.train
    batch_size, local_epochs, local_steps = tc.batch_size, tc.local_epochs, tc.local_steps
    rule = {"rule": tc.cohort} if hasattr(tc, "cohort") else {}
    out = []
    for t in range(1, rounds + 1):
        sizes = []
        for c in population.cohort(cfg.seed, t, tc.clients_per_round, **rule):
            sizes += batch_sizes(int(population.sizes[c]), batch_size, local_epochs, local_steps)
        out.append(sizes)
    return out


def centralised_loop(model: torch.nn.Module, train_x: torch.Tensor, train_y: torch.Tensor,
                     batch_sizes: list[int], lr: float, seed: int) -> float:
    """Plain SGD over `batch_sizes` batches drawn (without replacement, epoch by epoch) from the
    whole training set; returns the wall time of the loop."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    n = len(train_y)
    perm, pos = None, n
    t0 = time.perf_counter()
    for bs in batch_sizes:
        if pos + bs > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos : pos + bs]
        pos += bs
        x, y = train_x[idx], train_y[idx]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def fresh_model(cfg, data) -> torch.nn.Module:
    from .models import build_model

    torch.manual_seed(cfg.seed)
    return build_model(cfg.model, data.input_shape, data.num_classes)


# ---- in-process measurements ---------------------------------------------------------------------

class InProcess:
    """One Trainer (world size 1) whose rounds are timed, reset to its initial state before each run."""

    def __init__(self, rounds: int, run_dir: str, overrides: list[str] | None = None):
        from . import dist
        from .config import load_config
        from .federation.runner import Trainer

        self.rounds = rounds
        self.cfg = load_config(None, overrides or workload_overrides(rounds, run_dir))
        self.ctx = dist.init(self.cfg.runtime.device, self.cfg.runtime.threads)
        self.trainer = Trainer(self.cfg, self.ctx)
        tr = self.trainer
        self.init_params = tr.global_params.clone()
        self.init_buffers = tr.global_buffers.clone()
        self.init_int = [t.clone() for t in tr.worker._int_snapshot]
        self.init_server = copy.deepcopy(tr.algorithm.server_state())
        self.batches = batch_sizes_of_rounds(tr.population, self.cfg, rounds)

    def reset(self) -> None:
        tr = self.trainer
        tr.global_params.copy_(self.init_params)
        tr.global_buffers.copy_(self.init_buffers)
        tr.worker._int_snapshot = [t.clone() for t in self.init_int]
        tr.algorithm.load_server_state(copy.deepcopy(self.init_server))

    def time_fl(self, rounds: int | None = None) -> dict:
        from . import dist

        rounds = self.rounds if rounds is None else rounds
        self.reset()
        calls0 = dist.COLLECTIVE_CALLS["round_stats"]
        bytes0 = dist.COLLECTIVE_BYTES["round_stats"]
        round_s, samples = [], 0
        t0 = time.perf_counter()
        for t in range(1, rounds + 1):
            t1 = time.perf_counter()
            row = self.trainer.run_round(t)
            round_s.append(time.perf_counter() - t1)
            samples += row["samples"]
        total = time.perf_counter() - t0
        return {"total_s": total, "round_s": round_s, "samples": samples,
                "all_reduce_calls": dist.COLLECTIVE_CALLS["round_stats"] - calls0,
                "all_reduce_bytes": dist.COLLECTIVE_BYTES["round_stats"] - bytes0,
                "bytes_reduced_reported": row["bytes_reduced"]}

    def time_centralised(self, batch_sizes: list[int] | None = None) -> float:
        sizes = [b for r in self.batches for b in r] if batch_sizes is None else batch_sizes
        model = fresh_model(self.cfg, self.trainer.data)
        data = self.trainer.data
        return centralised_loop(model, data.train_x, data.train_y, sizes, self.cfg.train.lr, self.cfg.seed)


def time_privacy_ops(private: "InProcess", repeats: int = 200) -> dict:
    """What DP adds to a round, each piece timed alone (median of `repeats`, ms): the norm of one client's
    update (float64 accumulation), the round's noise draw, the accountant's epsilon. Free of the round's
    own variance, which on a loaded machine hides a 1 ms difference in the interleaved comparison."""
    from .privacy.mechanism import standard_normal

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
    noise = median_ms(lambda: float(standard_normal(0, 1, 0, numel, tr.device)[0]))
    eps = median_ms(lambda: tr.ledger.epsilon_after(private.rounds))
    clients = private.cfg.train.clients_per_round
    return {"norm_ms_per_client": norm, "noise_ms_per_round": noise, "accountant_ms_per_round": eps,
            "ms_per_round": clients * norm + noise + eps, "clients_per_round": clients}


# ---- subprocesses --------------------------------------------------------------------------------

def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the process group the bench started for `proc` (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _popen(cmd: list[str], cwd: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=_env(), start_new_session=True, text=True, **kw)


def _run(cmd: list[str], cwd: str, what: str) -> str:
    proc = _popen(cmd, cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        _kill_group(proc)  # torchrun's workers included; a no-op when all have exited
    if proc.returncode != 0:
        lines = out.splitlines()
        # The workers' tracebacks come first; torchrun's summary of the failure last.
        text = "\n".join(lines[:120] + (["..."] if len(lines) > 160 else []) + lines[max(120, len(lines) - 40):])
        raise RuntimeError(f"bench: {what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{text}")
    return out


def time_ranks(nproc: int, config_path: str, tmp: str, tag: str) -> dict:
    """`distfl train` under torchrun with `nproc` processes; the sum of metrics.jsonl's round_s."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"ranks{nproc}_{tag}_", dir=tmp))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "distfl", "train", config_path, f"output.dir={run_dir}"]
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
    from . import dist
    from .config import load_config
    from .data.datasets import load_dataset

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


# ---- the bench -----------------------------------------------------------------------------------

def _command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "__main__.py" and Path(argv[0]).parent.name == "distfl":
        argv[0:1] = [sys.executable, "-m", "distfl"]
    return " ".join(argv)


def _median(xs):
    return statistics.median(xs)


def _fmt_bool(ok: bool) -> str:
    return "met" if ok else "**not met**"


def markdown_table(res: dict) -> str:
    o, s, c, m = res["overhead"], res["scaling"], res["collectives"], res["medians"]
    rows = [
        ("Simulation overhead: FL / centralised (ratio of medians)",
         f"{o['ratio_of_medians']:.3f} (per repeat {', '.join(f'{r:.3f}' for r in o['per_repeat'])})",
         f"<= {TARGET_OVERHEAD}", _fmt_bool(o["met"])),
        ("FL rounds in-process, 1 process (median)", f"{m['fl_inprocess_s']:.2f} s", "", ""),
        ("Centralised loop, same steps and batch sizes (median)", f"{m['centralised_s']:.2f} s", "", ""),
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
         f"== {c['expected_bytes_per_round']:,} (8 x (params + buffers + {c['standard_values']}))",
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
    from .federation.aggregate import STANDARD_SEGMENTS

    if rounds < 1 or repeats < 1:
        raise ValueError("bench: --rounds and --repeats must be at least 1")
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    raw = {k: [] for k in ("fl_inprocess_s", "fl_inprocess_round_s", "centralised_s", "rank1_s",
                           "rank1_round_s", "rank2_s", "rank2_round_s", "ceiling_solo_s", "ceiling_pair_s",
                           "plain_uniform_s", "dp_s")}
    started = time.time()
    load_at_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    try:
        with tempfile.TemporaryDirectory(prefix="distfl_bench_") as tmp:
            log(f"setting up: {rounds} rounds x {repeats} repeats (loading Fashion-MNIST, partitioning)")
            tmp_dir = tmp
            ip = InProcess(rounds, str(Path(tmp) / "inprocess"))
            plain = InProcess(rounds, str(Path(tmp) / "plain"), workload_overrides(rounds, str(Path(tmp) / "plain"))
                              + DP_WORKLOAD[:1])
            private = InProcess(rounds, str(Path(tmp) / "dp"), workload_overrides(rounds, str(Path(tmp) / "dp"))
                                + DP_WORKLOAD)
            cfg = ip.cfg
            steps_total = sum(len(r) for r in ip.batches)
            samples_total = sum(sum(r) for r in ip.batches)
            log(f"{steps_total} SGD steps ({samples_total} samples) per measurement"
                + ("; warming up" if warmup else "; no warm-up (--quick)"))

            # Configs for the subprocesses (data.root made absolute: they run in temp dirs).
            sub_overrides = workload_overrides(rounds, str(Path(tmp) / "unused")) + [
                f"data.root={Path(cfg.data.root).resolve()}"]
            from .config import dump_config, load_config

            config_path = Path(tmp) / "bench.yaml"
            config_path.write_text(dump_config(load_config(None, sub_overrides)))
            spec_path = Path(tmp) / "ceiling.json"
            spec_path.write_text(json.dumps({"overrides": sub_overrides,
                                             "batch_sizes": [b for r in ip.batches for b in r],
                                             "warmup_batch_sizes": ip.batches[0] if warmup else []}))

            # Warm-up (untimed): one FL round and the centralised loop over that round's batches.
            if warmup:
                ip.time_fl(rounds=1)
                ip.time_centralised(ip.batches[0])
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
                raw["fl_inprocess_round_s"].append(r["round_s"])
                collectives.append(r)
                return f"FL in-process {r['total_s']:.2f} s"

            def central():
                s = ip.time_centralised()
                raw["centralised_s"].append(s)
                return f"centralised {s:.2f} s"

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
                steps = [fl, central, ranks(1), ranks(2), solo, pair, dp]
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
            segments = list(STANDARD_SEGMENTS) + ip.trainer.algorithm.all_segments()
            values = sum(s.numel for s in segments)
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)

    med = {
        "fl_inprocess_s": _median(raw["fl_inprocess_s"]),
        "centralised_s": _median(raw["centralised_s"]),
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
            "overrides": WORKLOAD, "harness": HARNESS, "rounds": rounds, "repeats": repeats,
            "steps_per_round": [len(r) for r in ip.batches], "samples_per_round": [sum(r) for r in ip.batches],
            "steps_total": steps_total, "samples_total": samples_total,
            "order": "per repeat: FL in-process, centralised, 1-rank, 2-rank, ceiling solo, ceiling pair, "
                     "plain (uniform) then DP in-process; "
                     "reversed on every other repeat",
        },
        "raw": raw,
        "medians": med,
        "overhead": {"ratio_of_medians": overhead, "per_repeat": overhead_per, "target": TARGET_OVERHEAD,
                     "met": overhead <= TARGET_OVERHEAD},
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


def _raise_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def main_methods(args) -> int:
    """`--suite ffc|tct`: the cost of a paper method's extra phase (distfl/bench_methods.py);
    `--suite cross-device`: packs of clients (distfl/bench_cross_device.py)."""
    from . import bench_cross_device, bench_methods

    quick = getattr(args, "quick", False)
    repeats = 1 if quick else int(args.repeats)
    suite = args.suite
    out = Path(args.out) if args.out != "bench/results.json" else Path(f"bench/{suite}.json")
    if suite == "cross-device":
        res = bench_cross_device.bench_cross_device(1 if quick else int(args.rounds), repeats, log)
    else:
        res = getattr(bench_methods, f"bench_{suite}")(repeats, log)
    res.update(bench=f"distfl bench --suite {suite}", command=_command_line(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               machine={"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None})
    table = getattr(bench_cross_device if suite == "cross-device" else bench_methods,
                    f"{suite.replace('-', '_')}_markdown")(res)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table, end="")
    log(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def main(args) -> int:
    if getattr(args, "suite", "runtime") != "runtime":
        return main_methods(args)
    quick = bool(getattr(args, "quick", False))
    rounds = 2 if quick else int(args.rounds)
    repeats = 1 if quick else int(args.repeats)
    out = Path(args.out)
    # SIGTERM unwinds like Ctrl-C, so the `finally` blocks kill the subprocesses the bench started.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        res = run_bench(rounds, repeats, out, warmup=not quick)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    res["args"]["quick"] = quick
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(res["table_markdown"])
    print()
    print(res["table_markdown"], end="")
    log(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--ceiling-worker":
        sys.exit(ceiling_worker(sys.argv[2]))
    print("usage: distfl bench [--out FILE] [--rounds N] [--repeats N]  (this module's own entry is internal)",
          file=sys.stderr)
    sys.exit(2)
