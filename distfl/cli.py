"""`distfl train | partition | bench | sweep | report` (also `python -m distfl ...`)."""
from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from pathlib import Path

from . import launcher
from .errors import ConfigError, DistflError, Interrupted
from .faults import Failure, RunFailed, debug_enabled

USAGE = """distfl train CONFIG [key=value ...] [--print-config] [--overwrite] [--debug]
       distfl train --resume RUN_DIR [key=value ...] [--debug]
       distfl train CONFIG --nproc N [key=value ...]     N ranks under torchrun, started by distfl
       distfl calibrate RUN_DIR [--method ffc|ccvr] [calibration.KEY=VALUE ...]
       distfl partition CONFIG [key=value ...] [--out FILE.npz]
       distfl data prepare NAME --from DIR --out FOLDER [--split sample|user] [--seed N] [--sequence-length L]
                           [--oov-buckets B] [--packages P,Q,...]
       distfl bench [--suite runtime|ffc|tct|cross-device|startup|system|privacy|whole-run|compression|lora] [--device cpu|cuda] [--out FILE] [--rounds N] [--repeats N] [--quick] [KEY=VALUE ...]
       distfl sweep CONFIG [key=value ...] [--grid KEY=V1,V2 ...] [--points FILE | --zip KEY=V1,V2 ...] [--seeds 0,1,2] [--executor local|slurm]
                    [--nproc N] [--partition P] [--time MIN] [--nodes N] [--tasks-per-node N] [--wait] [--dry-run]
       distfl report SWEEP_DIR|RUN_DIR ... [--out DIR] [--by KEY,KEY] [--metric NAME] [--label 'AUTO:TEXT'] [--sort KEY]
                     [--per-client] [--style default|paper|slide] [--size W,H] [--logx] [--logy]
       distfl --version
Run under torchrun for several ranks:  torchrun --nproc_per_node=2 -m distfl train CONFIG"""


OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def cmd_train(args) -> int:
    from .config import config_from_dict, dump_config, load_config

    if args.nproc is not None and args.nproc != 1:
        return _train_under_torchrun(args)
    if args.resume:
        if args.config is not None:
            raise ConfigError("give either CONFIG or --resume RUN_DIR, not both (a resumed run uses its saved config)")
        from .config.resume import saved_run_config

        base, saved = saved_run_config(args.resume, "--resume")
        cfg = config_from_dict(base, args.overrides, source=str(saved))
    else:
        if args.config is None:
            raise ConfigError("distfl train needs a CONFIG file (or --resume RUN_DIR)")
        cfg = load_config(args.config, args.overrides)
    if args.print_config:
        if _is_main_process():
            print(dump_config(cfg), end="")
        return 0
    from .federation.runner import train

    summary = train(cfg, resume=bool(args.resume), overwrite=args.overwrite)
    _print_result(summary, cfg)
    return 0


def _train_under_torchrun(args) -> int:
    """`distfl train --nproc N`: torchrun with N ranks, started and signalled by distfl (distfl.launch)."""
    from .launch import run_ranks, torchrun_command

    if args.nproc < 1:
        raise ConfigError(f"--nproc must be a positive integer (ranks on this machine), got {args.nproc}")
    if "RANK" in os.environ:
        raise ConfigError("--nproc starts torchrun itself; under torchrun (or srun), leave it out")
    if args.config is not None and args.resume:
        raise ConfigError("give either CONFIG or --resume RUN_DIR, not both (a resumed run uses its saved config)")
    if args.config is not None:
        from .config import load_config

        load_config(args.config, args.overrides)  # a bad config: one line here, before torchrun starts
        target = [args.config]
    elif args.resume:
        from .config.resume import saved_run_config

        saved_run_config(args.resume, "--resume")  # no saved run there: one line here, before torchrun starts
        target = ["--resume", args.resume]
    else:
        raise ConfigError("distfl train needs a CONFIG file (or --resume RUN_DIR)")
    flags = [f for f, on in (("--overwrite", args.overwrite), ("--debug", args.debug),
                             ("--print-config", args.print_config)) if on]
    return run_ranks(torchrun_command(args.nproc, ["train", *target, *args.overrides, *flags]))


def _print_result(summary: dict, cfg) -> None:
    from .logging import result_lines

    if _is_main_process():
        print("\n".join(result_lines(summary, Path(cfg.output.dir))))


CALIBRATIONS = {"ffc": "FFC", "ccvr": "CCVR"}  # calibration.method values `distfl calibrate --method` runs


def calibration_settings(method: str) -> list[str]:
    """The calibration.* keys that apply to `method` (what `distfl calibrate --method METHOD` accepts)."""
    from .config import config_keys
    from .config.validate import key_applies

    return [key for key in config_keys() if key.startswith("calibration.") and key != "calibration.method"
            and key_applies(key, {"calibration.method": method})]


def cmd_calibrate(args) -> int:
    """FFC or CCVR on a trained run: resume it with calibration.method=METHOD (it continues training first
    if it stopped early): the same bits as `distfl train --resume RUN_DIR calibration.method=METHOD`."""
    from .checkpoint import checkpoints_dir

    run_dir, method = Path(args.run_dir), args.method
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} is not a distfl run directory (no config.yaml)")
    if not (checkpoints_dir(run_dir) / "latest").exists():
        raise ConfigError(
            f"{run_dir} has no checkpointed model to calibrate ({checkpoints_dir(run_dir) / 'latest'} is missing: "
            "the run stopped before its first checkpoint). Train it first; the last round is always checkpointed")
    settings = calibration_settings(method)
    for item in args.overrides:
        key, _, value = item.partition("=")
        if key.strip() not in settings and (key.strip(), value.strip()) != ("calibration.method", method):
            flag = "" if method == "ffc" else f" --method {method}"
            raise ConfigError(f"distfl calibrate{flag} takes only the {CALIBRATIONS[method]} settings "
                              f"{', '.join(settings)}; got {item}. To change other keys, continue the run: "
                              f"`distfl train --resume {run_dir} calibration.method={method} KEY=VALUE`")
    args.resume, args.config, args.print_config, args.overwrite, args.nproc = str(run_dir), None, False, False, None
    args.overrides = [f"calibration.method={method}", *args.overrides]
    return cmd_train(args)


def cmd_partition(args) -> int:
    from .config import data_seed, load_config
    from .data.datasets import load_dataset
    from .data.partition import describe, partition, save_partition

    if args.out is not None:
        _check_npz_out(args.out)
    cfg = load_config(args.config, args.overrides)
    seed = data_seed(cfg)
    data = load_dataset(cfg.data, seed)
    if data.tokens is not None:
        raise ConfigError(f"distfl partition splits and describes samples by class, but {data.name} is a next-token "
                          "dataset split by its own clients; `distfl data prepare` prints them")
    labels = data.train_y.numpy()
    parts = partition(labels, cfg.partition, data.num_classes, seed, natural=data.train_offsets)
    print(f"{cfg.partition.scheme} partition of {cfg.data.dataset} ({len(labels)} samples) into "
          f"{cfg.partition.num_clients} clients, seed {seed}")
    print(describe(parts, labels, data.num_classes))
    if args.out is not None:
        save_partition(parts, args.out)
        print(f"wrote {len(parts)} clients' training-set indices to {args.out} (client_0 .. client_{len(parts) - 1})")
    return 0


def cmd_data(args) -> int:
    from .data.prepare_stream import prepare
    from .data.prepared import describe, load_prepared

    prepare(args.name, args.source, args.out, args.split, args.seed, args.embeddings, args.vocabulary,
            args.sequence_length, args.oov_buckets, tuple(filter(None, args.packages.split(","))))
    fed = load_prepared(args.out)
    print(f"prepared {args.name} from {args.source}: {describe(fed)}")
    print(f"wrote {args.out}; train on it with data.dataset=prepared data.path={args.out} "
          f"partition.scheme=natural partition.num_clients={fed.num_clients}")
    return 0


def _check_npz_out(out: str) -> None:
    """Fail on an unusable --out path before any work."""
    if not out.endswith(".npz"):
        raise ConfigError(f"--out {out}: the partition is written as a NumPy .npz file; give a path ending in .npz")
    if Path(out).is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file path ending in .npz")
    parent = Path(out).resolve().parent
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"--out {out}: cannot write there ({existing} is not a writable directory)")


def cmd_bench(args) -> int:
    from .bench import main as bench_main

    return bench_main(args)


# `distfl sweep` flags that set a Slurm option (docs/sweeps.md): flag -> option name.
SLURM_FLAGS = {"--partition": "partition", "--time": "time", "--nodes": "nodes",
               "--tasks-per-node": "tasks_per_node", "--gpus-per-node": "gpus_per_node",
               "--cpus-per-task": "cpus_per_task", "--mem-gb": "mem_gb", "--account": "account",
               "--qos": "qos", "--constraint": "constraint"}
# Flags whose value may look like a `key=value` override and must stay with the flag.
SWEEP_VALUE_FLAGS = {"--grid", "--zip", "--points", "--slurm", "--seeds", "--executor", "--nproc", *SLURM_FLAGS}


def cmd_sweep(args) -> int:
    from .sweep import parse_slurm_arg, run_sweep

    slurm = {}
    for item in args.slurm:
        for key, value in parse_slurm_arg(item).items():
            if key == "additional":
                slurm.setdefault("additional", {}).update(value)
            else:
                slurm[key] = value
    for flag, name in SLURM_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            slurm[name] = value
    return run_sweep(args.config, fixed=args.overrides, grid_args=args.grid, seeds_arg=args.seeds,
                     executor=args.executor, nproc=args.nproc, slurm_args=slurm, wait=args.wait,
                     dry_run=args.dry_run, points_arg=args.points, zip_args=args.zip)


def cmd_report(args) -> int:
    from .report import main as report_main

    by = [k for k in args.by.split(",") if k] if args.by else None
    metrics = [m.strip() for item in args.metric for m in item.split(",") if m.strip()]
    return report_main(args.paths, out_dir=args.out, by=by, metrics=metrics, label=args.label, sort=args.sort,
                       per_client=args.per_client, style=args.style, size=args.size, logx=args.logx, logy=args.logy)


def _command_usage(command: str) -> str:
    """The lines of USAGE for one command (with their continuation lines), for its own --help."""
    lines, keep = [], False
    for line in USAGE.splitlines():
        if line.strip().startswith("distfl "):
            keep = line.strip().startswith(f"distfl {command} ")
            line = " " * len("usage: ") + line.strip()
        elif not line.startswith(" "):
            keep = False
        if keep:
            lines.append(line)
    return "\n".join(lines).strip()


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a refusal in one line (argparse prints the usage first, two to six lines of it)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` shows the usage)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    # the subcommands' parsers are of the same class
    parser = OneLineParser(prog="distfl", usage=USAGE)
    parser.add_argument("--version", action="version", version=f"distfl {__version__}")
    # prog: a command's own --help shows `distfl COMMAND`, not the whole USAGE glued in front.
    sub = parser.add_subparsers(dest="command", required=True, prog="distfl")
    parser.commands = sub.choices  # name -> its parser
    p = sub.add_parser("train", help="train (or resume) one run")
    p.add_argument("config", nargs="?", help="YAML config file; then dotted overrides, e.g. train.rounds=50")
    p.set_defaults(overrides=[])
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--overwrite", action="store_true", help="replace a finished or partial run in output.dir")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="start N ranks here under torchrun, launched by distfl: Ctrl-C then checkpoints and "
                        "exits 3 with one line (docs/faults.md)")
    p.add_argument("--debug", action="store_true", help="print the full traceback of an unexpected error "
                                                        "(also DISTFL_DEBUG=1); else it is saved in RUN_DIR/error.log")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("calibrate", help="calibrate the head of a trained run: SphereFed's FFC (least-squares head from "
                                         "summed Z^T Z, Z^T Y) or CCVR (the head retrained on virtual features)")
    p.add_argument("run_dir", help="a run directory with a checkpoint; then calibration.* overrides")
    p.add_argument("--method", choices=sorted(CALIBRATIONS), default="ffc",
                   help="ffc (default: SphereFed's FFC) | ccvr (Luo et al. 2021); docs/algorithms/ccvr.md")
    p.set_defaults(overrides=[])
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("partition", help="print per-client sizes and class histograms; --out saves the split")
    p.add_argument("config")
    p.add_argument("--out", metavar="FILE.npz",
                   help="also write the partition: one int64 array of training-set indices per client, "
                        "named client_<id>, in the order training uses")
    p.set_defaults(overrides=[])
    p.set_defaults(func=cmd_partition)
    p = sub.add_parser("data", help="prepare a downloaded federated dataset once into a memory-mapped folder")
    p.add_argument("action", choices=["prepare"])
    p.add_argument("name", help="the source format: leaf (a LEAF dataset's data/ folder), tff (the folder of "
                                "TFF's PREFIX_train.h5 and PREFIX_test.h5) or python (a folder of Python packages, "
                                "e.g. the standard library's, as a code-completion federation: docs/datasets.md)")
    p.add_argument("--from", dest="source", required=True, metavar="DIR", help="the downloaded dataset")
    p.add_argument("--out", required=True, metavar="FOLDER", help="the folder to write (data.path of "
                                                                  "data.dataset=prepared)")
    p.add_argument("--split", choices=["sample", "user"], default="sample",
                   help="leaf, from all_data/ only: LEAF's sample-wise or user-wise split (default sample)")
    p.add_argument("--seed", type=int, default=0, help="leaf, from all_data/ only: the split's seed (default 0)")
    p.add_argument("--embeddings", default="", metavar="EMBS_JSON",
                   help="leaf, Sent140: LEAF's embs.json (data.embeddings); its vectors are stored in the folder")
    p.add_argument("--vocabulary", default="", metavar="VOCAB",
                   help="leaf, Reddit: LEAF's reddit_vocab.pck or its JSON conversion (data.vocabulary)")
    p.add_argument("--sequence-length", type=int, default=0, metavar="L",
                   help="tff, Shakespeare and StackOverflow: input tokens a sample (default 0: TFF's 80 and 20); "
                        "python: bytes a sample (default 0: 64)")
    p.add_argument("--oov-buckets", type=int, default=0, metavar="B",
                   help="tff, StackOverflow: out-of-vocabulary buckets (default 0: one, TFF's default)")
    p.add_argument("--packages", default="", metavar="P,Q,...",
                   help="python: the packages under --from that are the clients (default: all of them)")
    p.set_defaults(func=cmd_data)
    p = sub.add_parser("bench", help="measure simulation overhead, rank scaling and collectives")
    p.add_argument("--out", default="bench/results/results.json", help="where to write the JSON results")
    p.add_argument("--rounds", type=int, default=None,
                   help="FL rounds per measurement (default 10; whole-run suite: each run's own, at most this)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (medians are reported)")
    p.add_argument("--quick", action="store_true", help="2 rounds, 1 repeat: checks the bench runs, measures nothing")
    p.add_argument("--suite", choices=["runtime", "ffc", "tct", "cross-device", "startup", "system", "privacy", "whole-run",
                                       "compression", "lora"],
                   default="runtime",
                   help="runtime: overhead, scaling, collectives (default); ffc / tct: a paper method's "
                        "extra phases against a training round; cross-device: seconds per round one client "
                        "at a time versus packs (runtime.pack_size); startup: what a short 2-rank run spends outside training; "
                        "privacy: seconds to draw a million parameters' DP noise, secret and keyed; "
                        "whole-run: training seconds of pfl-research's CIFAR-10 benchmark run and of the quickstart; "
                        "lora: memory and seconds per round of LoRA against full fine-tuning "
                        "(written to bench/results/<suite>.json)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="runtime and cross-device suites: the device the runs train on (default: runtime cpu, "
                        "cross-device cuda when available); tct suite: where the eNTK features are computed "
                        "(default cpu, 1 thread; stage 2 stays on the host); privacy suite: where the noise "
                        "is drawn (default cpu)")
    p.add_argument("--pack-sizes", default="1,10", metavar="P1,P2,...",
                   help="cross-device suite: the runtime.pack_size values timed side by side; the first is "
                        "the reference the others' speed-up and final-model difference are measured against "
                        "(default: 1,10)")
    p.add_argument("--pfl-processes", default="1", metavar="N1,N2,...",
                   help="cross-device suite, with DISTFL_PFL_PYTHON set: pfl-research in each of these numbers of "
                        "worker processes sharing the device (default: 1)")
    p.add_argument("--ranks", default="", metavar="N1,N2,...",
                   help="cross-device suite: also time `distfl train` with these numbers of ranks sharing the "
                        "device (torchrun, gloo), packs of the largest --pack-sizes value (default: none)")
    # KEY=VALUE anywhere after `bench` (taken out by `main`, as for `train`): cross-device and whole-run
    # suites, config overrides for every distfl run they time
    p.set_defaults(func=cmd_bench, overrides=[])
    p = sub.add_parser("sweep", help="run a grid of configs x seeds, here or on Slurm (docs/sweeps.md)")
    p.add_argument("config", help="base YAML config (its output.dir is the sweep directory); then fixed overrides")
    p.set_defaults(overrides=[])
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a config key and its values; repeat for more keys (the grid is their product)")
    p.add_argument("--points", metavar="FILE",
                   help="listed points: a YAML/JSON list of mappings of overrides, one a point, e.g. "
                        "[{algorithm.name: fedavg, eval.finetune_epochs: 5}, {algorithm.name: ditto}]; "
                        "the grid's product is taken with each")
    p.add_argument("--zip", action="append", default=[], metavar="KEY=V1,V2",
                   help="keys zipped, not multiplied: point i takes the i-th value of each --zip key")
    p.add_argument("--seeds", help="seeds of every grid point, e.g. 0,1,2 or 0-4 (default: the config's seed)")
    p.add_argument("--executor", choices=["local", "slurm"], help="where the runs go (default: local)")
    p.add_argument("--nproc", type=int, help="local: ranks per run (torchrun) (default 1)")
    p.add_argument("--wait", action="store_true", help="slurm: wait until every job has finished")
    p.add_argument("--dry-run", action="store_true", help="print the runs and what would happen, run nothing")
    p.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                   help="any Slurm option of the sweep block (docs/sweeps.md), e.g. --slurm signal_delay_s=300; "
                        "additional.OPTION=VALUE passes a raw sbatch option")
    for flag, name in SLURM_FLAGS.items():
        p.add_argument(flag, metavar=name.upper(), help=f"slurm: same as --slurm {name}=VALUE")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("report", help="tables and plots of a sweep's (or run directories') results")
    p.add_argument("paths", nargs="+", help="sweep directories and/or run directories")
    p.add_argument("--out", help="where to write report.md, report.csv and the plots (default: "
                                 "SWEEP_DIR/report, or ./report for several paths)")
    p.add_argument("--by", metavar="KEY,KEY", help="group the runs by these config keys (default: the swept "
                                                   "keys, or the keys whose values differ between the runs)")
    p.add_argument("--metric", action="append", default=[], metavar="NAME",
                   help="a number of metrics.jsonl or summary.json to report (several allowed; the first is "
                        "plotted); default: client_acc_mean, client_acc_p10, client_acc_min and test_acc when "
                        "the runs evaluated clients, else test_acc")
    p.add_argument("--label", action="append", default=[], metavar="'AUTO:TEXT'",
                   help="rename a group in the table and the figures, e.g. --label 'fedavg, finetune_epochs=5:FedAvg + FT'")
    p.add_argument("--sort", metavar="KEY",
                   help="order the rows by this metric (accuracies highest first, others lowest first) or grouping "
                        "key; default: the first metric; none: the order the runs were found in")
    p.add_argument("--per-client", action="store_true",
                   help="also draw the CDF of per-client accuracy from each run's clients.csv (eval.clients)")
    p.add_argument("--style", default="default", choices=["default", "paper", "slide"],
                   help="figure size and fonts: default, paper (one column of a two-column paper), slide")
    p.add_argument("--size", metavar="W,H", help="figure size in inches, e.g. 3.4,2.5 (default: the style's)")
    p.add_argument("--logx", action="store_true", help="logarithmic x axis")
    p.add_argument("--logy", action="store_true", help="logarithmic y axis")
    p.set_defaults(func=cmd_report)
    for command, p in sub.choices.items():
        p.usage = _command_usage(command)
        if p.get_default("overrides") is not None:
            p.epilog = ("key=value: dotted config overrides, anywhere after the command, e.g. train.rounds=50 "
                        "algorithm.options.beta=0.5 (every key: docs/config.md)")
    sub.choices["calibrate"].epilog = "key=value: only the settings of the method: " + "; ".join(
        f"{name} {', '.join(calibration_settings(method))}" for method, name in CALIBRATIONS.items()) + (
        "; other keys: distfl train --resume RUN_DIR")
    return parser


def _plain_config_warnings() -> None:
    """A ConfigWarning (a key set that the run ignores) reaches the user as `distfl: warning: ...`: a
    line about their config, not a source file and line of distfl; once per message (a sweep checks
    the same key in every point) and on rank 0 only. Other warnings show as before."""
    import warnings

    from .config import ConfigWarning

    show = warnings.showwarning
    if getattr(show, "distfl_plain", False):
        return
    shown = set()

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ConfigWarning):
            if _is_main_process() and str(message) not in shown:
                shown.add(str(message))
                print(f"distfl: warning: {message}", file=sys.stderr if file is None else file, flush=True)
            return
        show(message, category, filename, lineno, file, line)

    showwarning.distfl_plain = True
    warnings.showwarning = showwarning


class PipeSafe:
    """sys.stdout or sys.stderr of the `distfl` command, whose reader may leave before the run ends
    (`distfl train ... | head`): from the first write to a closed pipe on, the stream writes to os.devnull,
    and the run goes on to its end."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())  # the descriptor itself: also what is still buffered, and subprocesses
        os.close(devnull)
        try:
            self.stream.flush()
        except OSError:
            pass

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main(argv=None) -> int:
    """`distfl ARGV` (the command line when `argv` is None)."""
    if argv is None:
        sys.stdout, sys.stderr = PipeSafe(sys.stdout), PipeSafe(sys.stderr)
        # The `distfl` console script, like `python -m distfl`, imports a plugin (algorithm.name=mine:Method)
        # from the current directory: Python puts it on sys.path for -m, but puts the script's folder there
        # for a console script.
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # `key=value` overrides may stand anywhere after the command, also after flags: take them out first.
    # Only a command that takes overrides has them: `distfl report --label 'round=wait_all:Sync'` keeps its
    # label, whatever it looks like.
    command = parser.commands.get(argv[0]) if argv else None
    takes_overrides = command is not None and command.get_default("overrides") is not None
    overrides, rest = [], argv[:1]
    for i, a in enumerate(argv[1:], 1):
        # `distfl sweep --grid k=v1,v2`: the flag's value is not an override.
        if takes_overrides and OVERRIDE.match(a) and not (argv[0] == "sweep" and argv[i - 1] in SWEEP_VALUE_FLAGS):
            overrides.append(a)
        else:
            rest.append(a)
    args = parser.parse_args(rest)
    if hasattr(args, "overrides"):
        args.overrides = args.overrides + overrides
    debug = getattr(args, "debug", False) or debug_enabled()
    _plain_config_warnings()
    try:
        try:
            return args.func(args)
        except Exception as exc:
            if isinstance(exc, RunFailed) or not isinstance(exc, DistflError):  # not a refused input
                launcher.exit_if_orphaned()  # a rendezvous broken by a dead torchrun: one line, not its error
            raise
    except RunFailed as exc:
        if debug:
            traceback.print_exception(exc.original)
        if not exc.quiet:  # every rank that failed on its own says so; the others follow from it
            print(f"distfl: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except Interrupted as exc:
        if _is_main_process():
            print(f"distfl: {exc}", file=sys.stderr, flush=True)
        from .launch import report_stop

        # Not finished: status 3. Under `distfl train --nproc`, distfl's launcher exits 3 once a rank has
        # told it so; torchrun, seeing every rank exit 0, ends without its traceback.
        return 0 if report_stop() else 3
    except DistflError as exc:
        if _is_main_process():
            print(f"distfl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        if _is_main_process():
            from .federation.stopping import interrupted_line

            print(f"distfl: {interrupted_line(exc)}", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:
        if debug:
            raise
        failure = Failure(exc, f"distfl {args.command}", None, 0, 1, 0.0)
        if _is_main_process():
            print(f"distfl: error: {failure.line}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
