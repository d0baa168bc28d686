"""`distfl train | partition | bench` (also `python -m distfl ...`)."""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from .errors import ConfigError, DistflError

USAGE = """distfl train CONFIG [key=value ...] [--print-config] [--overwrite]
       distfl train --resume RUN_DIR [key=value ...]
       distfl partition CONFIG [key=value ...]
       distfl bench [--out FILE] [--rounds N]
Run under torchrun for several ranks:  torchrun --nproc_per_node=2 -m distfl train CONFIG"""


OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def cmd_train(args) -> int:
    from .config import config_from_dict, dump_config, load_config

    if args.resume:
        if args.config is not None:
            raise ConfigError("give either CONFIG or --resume RUN_DIR, not both (a resumed run uses its saved config)")
        run_dir = Path(args.resume)
        saved = run_dir / "config.yaml"
        if not saved.exists():
            raise ConfigError(f"--resume {run_dir}: no config.yaml there; is it a distfl run directory?")
        import yaml

        base = yaml.safe_load(saved.read_text())
        base.setdefault("output", {})["dir"] = str(run_dir)
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
    if _is_main_process():
        acc = summary["final_test_acc"]
        print(f"final test accuracy {100 * acc:.2f}% (best {100 * summary['best_test_acc']:.2f}% at round "
              f"{summary['best_round']}), {summary['rounds']} rounds in {summary['wall_s']:.1f}s; "
              f"summary: {Path(cfg.output.dir) / 'summary.json'}")
    return 0


def cmd_partition(args) -> int:
    from .config import load_config
    from .data.datasets import load_dataset
    from .data.partition import describe, partition

    cfg = load_config(args.config, args.overrides)
    data = load_dataset(cfg.data, cfg.seed)
    labels = data.train_y.numpy()
    parts = partition(labels, cfg.partition, data.num_classes, cfg.seed)
    print(f"{cfg.partition.scheme} partition of {cfg.data.dataset} ({len(labels)} samples) into "
          f"{cfg.partition.num_clients} clients, seed {cfg.seed}")
    print(describe(parts, labels, data.num_classes))
    return 0


def cmd_bench(args) -> int:
    from .bench import main as bench_main

    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distfl", usage=USAGE)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train (or resume) one run")
    p.add_argument("config", nargs="?", help="YAML config file; then dotted overrides, e.g. train.rounds=50")
    p.set_defaults(overrides=[])
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--overwrite", action="store_true", help="replace a finished or partial run in output.dir")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("partition", help="print per-client sizes and class histograms")
    p.add_argument("config")
    p.set_defaults(overrides=[])
    p.set_defaults(func=cmd_partition)
    p = sub.add_parser("bench", help="measure simulation overhead, rank scaling and collectives")
    p.add_argument("--out", default="bench/results.json", help="where to write the JSON results")
    p.add_argument("--rounds", type=int, default=10, help="FL rounds per measurement")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (medians are reported)")
    p.add_argument("--quick", action="store_true", help="2 rounds, 1 repeat: checks the bench runs, measures nothing")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `key=value` overrides may stand anywhere after the command, also after flags: take them out first.
    overrides = [a for a in argv[1:] if OVERRIDE.match(a)]
    rest = argv[:1] + [a for a in argv[1:] if not OVERRIDE.match(a)]
    args = build_parser().parse_args(rest)
    if hasattr(args, "overrides"):
        args.overrides = args.overrides + overrides
    try:
        return args.func(args)
    except DistflError as exc:
        if _is_main_process():
            print(f"distfl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
