"""What a run writes (rank 0 only): metrics.jsonl, the trackers of `output.trackers` (TensorBoard by
default; MLflow, W&B: distfl/trackers.py), a progress display.

metrics.jsonl has one JSON object per round, with `round` first. On resume, rows after the checkpoint's
round are dropped (they are recomputed), so the file never holds a round twice; TensorBoard does the
same through `purge_step`. Trackers get every number of the row under a namespaced tag (test/accuracy,
train/lr, time/wall_s, ...: trackers.tag), the round's cohort size and update norm, and at the end of a
run the config keys that differ from their defaults (with the run's name) and the final metrics, global
and per-client (TensorBoard's HParams view).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from . import trackers as tracking
from .checkpoint import atomic_write_text
from .config import flatten_dict
from .errors import CheckpointError
from .faults import writing

# metrics.jsonl key -> TensorBoard tag (the keys trackers.tag names explicitly)
TB_TAGS = tracking.TAGS


class RunLogger:
    def __init__(self, run_dir: Path, output_cfg, is_main: bool, start_round: int, total_rounds: int,
                 resume_step: int | None = None, params=None, timings: bool = True):
        """`resume_step`: rows after this step are dropped (default: start_round - 1). `params`: the
        global model's flat parameters, for the update norm of the first round. `timings`: False (a private
        run, privacy/release.py) stamps every tracker scalar with this session's start time instead of the clock."""
        self.active = is_main
        self.total = total_rounds
        self.start = start_round
        self.t0 = time.time()
        self.mode = output_cfg.progress
        if self.mode == "auto":
            self.mode = "bar" if sys.stderr.isatty() else "log"
        self.last_eval = ""
        self.last_clients: dict = {}
        self.trackers: list[tracking.Tracker] = []
        self.status = "failed"  # until log_hparams, at the end of a run that completed
        self.previous = None
        if not self.active:
            return
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        resume_step = start_round - 1 if resume_step is None else resume_step
        self._truncate_after(resume_step)
        self.metrics_file = open(self.metrics_path, "a")
        self.trackers = tracking.open_trackers(self.run_dir, output_cfg, resume_step + 1, self._params(), self.info,
                                               walltime=None if timings else self.t0)
        self.previous = params.clone() if params is not None and self.trackers else None

    @property
    def tracking(self) -> bool:
        """Whether any tracker listens (rank 0 only): the runner then measures the update norm."""
        return bool(self.trackers)

    @property
    def writer(self):
        """TensorBoard's SummaryWriter, where output.trackers has it (None otherwise)."""
        return next((t.writer for t in self.trackers if isinstance(t, tracking.TensorBoard)), None)

    def _params(self, config: dict | None = None) -> dict:
        """The HParams columns: keys that differ from their defaults, the keys that name a run, the run's name."""
        from .config import config_to_dict
        from .config.schema import Config

        if config is None:
            try:
                import yaml

                config = yaml.safe_load((self.run_dir / "config.yaml").read_text()) or {}
            except (OSError, ValueError):
                config = {}
        defaults = flatten_dict(config_to_dict(Config()))
        return {"run": tracking.run_name(self.run_dir), **tracking.hparams(flatten_dict(config), defaults)}

    def _truncate_after(self, last_round: int) -> None:
        if not self.metrics_path.exists():
            return
        lines = [line for line in self.metrics_path.read_text().splitlines() if line.strip()]
        rows = []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except ValueError:
                if number == len(lines):  # a kill cut the last write short; that round is recomputed
                    break
                raise CheckpointError(f"{self.metrics_path} line {number} is not JSON: {line[:80]!r}; "
                                      "repair or remove that line to resume") from None
            if row["round"] <= last_round:
                rows.append(line)
                self.last_clients = {k: v for k, v in row.items() if k.startswith("client_acc_")} or self.last_clients
        atomic_write_text("".join(row + "\n" for row in rows), self.metrics_path)

    def log_round(self, row: dict, extra_scalars: dict | None = None, trainer=None) -> None:
        """A round's row to metrics.jsonl; it and `extra_scalars` to the trackers, with (given the
        `trainer`) the round's cohort size and the norm of the global model's change."""
        if not self.active:
            return
        self._write_row(row)
        if trainer is not None and self.trackers:
            extra_scalars = {**self._round_extras(trainer, row["round"]), **(extra_scalars or {})}
        self._scalars({tracking.tag(k): v for k, v in {**row, **(extra_scalars or {})}.items() if k != "round"},
                      row["round"])
        if "test_acc" in row:
            self.last_eval = f"acc {100 * row['test_acc']:.2f}% (round {row['round']})"
            if "client_acc_mean" in row:
                self.last_eval += f", clients {100 * row['client_acc_mean']:.2f}% mean"
                self.last_clients = {k: v for k, v in row.items() if k.startswith("client_acc_")}
        self._progress(row)

    def _round_extras(self, trainer, t: int) -> dict:
        import torch

        cfg, params = trainer.cfg, trainer.global_params
        # Under DP the cohorts come from the noise's key, and a Poisson cohort's size is not released (it
        # counts whether a client took part: add/remove adjacency).
        extras = {} if trainer.privacy is not None else {
            "cohort_size": len(trainer.population.cohort(cfg.seed, t, cfg.train.clients_per_round, cfg.train.cohort))}
        if self.previous is not None:
            extras["update_norm"] = float(torch.linalg.vector_norm(params - self.previous))
        self.previous = params.clone()
        return extras

    def _scalars(self, values: dict, step: int) -> None:
        numbers = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for tracker in list(self.trackers):
            self._observe(tracker, lambda: tracker.scalars(numbers, step), f"round {step}")

    def _observe(self, tracker, action, when: str) -> None:
        """An observer's call (MLflow, W&B): if it fails, one warning line, the tracker is dropped for the
        rest of the run, and training and metrics.jsonl go on. TensorBoard writes into the run directory, as
        metrics.jsonl does: its failure (a full disk) fails the run."""
        if isinstance(tracker, tracking.TensorBoard):
            action()
            return
        try:
            action()
        except Exception as exc:
            self.trackers.remove(tracker)
            tracker.abandon()
            self.info(f"warning: the {tracker.name} tracker failed at {when} ({type(exc).__name__}: "
                      f"{' '.join(str(exc).split())[:200]}); it is off for the rest of this run, which goes on, and "
                      f"metrics.jsonl keeps every round")

    def log_phase(self, row: dict) -> None:
        """A row from a phase after training (e.g. calibration): `round` is its checkpoint step and
        `phase` its name; written to metrics.jsonl and the trackers, announced on stderr."""
        if not self.active:
            return
        self._write_row(row)
        self._scalars({f"{row['phase']}/{k}": v for k, v in row.items() if k != "round"}, row["round"])

    def _write_row(self, row: dict) -> None:
        with writing(self.metrics_path):
            self.metrics_file.write(json.dumps(row) + "\n")
            self.metrics_file.flush()

    def log_hparams(self, config: dict, final: dict, step: int) -> None:
        """The run's config (the HParams columns: `_params`) and its final metrics (`hparams/<name>`
        scalars at `step`; the per-client ones from the last evaluation that had them)."""
        if not self.active:
            return
        metrics = {k: float(v) for k, v in final.items() if v is not None}
        for key, value in self.last_clients.items():
            metrics.setdefault(f"final_{key}", float(value))
        params = self._params(config)
        for tracker in list(self.trackers):
            self._observe(tracker, lambda: tracker.hparams(params, metrics, step), "the end of the run")
        self.status = "completed"

    def _progress(self, row: dict) -> None:
        t = row["round"]
        done = t - self.start + 1
        elapsed = time.time() - self.t0
        eta = elapsed / done * (self.total - t)
        loss = f"train loss {row['train_loss']:.4f}  " if "train_loss" in row else ""  # withheld under DP
        # With a system model, the simulated clock at the round's end.
        simulated = f"  simulated {clock(row['virtual_time_s'])}" if "virtual_time_s" in row else ""
        timing = f"  {row['round_s']:.2f}s/round  eta {clock(eta)}" if "round_s" in row else ""  # private: withheld
        text = f"round {t}/{self.total}  {loss}{self.last_eval}{simulated}{timing}"
        if self.mode == "bar":
            width = 24
            filled = int(width * t / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\033[K")
            if t == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif self.mode == "log" and ("test_acc" in row or t == self.total):
            print(text, file=sys.stderr, flush=True)

    def info(self, message: str) -> None:
        if self.active:
            if self.mode == "bar":
                sys.stderr.write("\r\033[K")
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close metrics.jsonl and every tracker, and raise the first OSError (named) after trying all."""
        if not self.active:
            return
        errors = []
        try:
            with writing(self.metrics_path):
                self.metrics_file.close()
        except OSError as exc:
            errors.append(exc)
        for tracker in list(self.trackers):
            if isinstance(tracker, tracking.TensorBoard):
                try:
                    tracker.close(self.status)
                except Exception as exc:  # every tracker is closed; the first error is raised
                    errors.append(exc)
            else:
                self._observe(tracker, lambda: tracker.close(self.status), "its close")
        if errors:
            raise errors[0]


def clock(seconds: float) -> str:
    """12m05s; 3h02m05s from an hour on."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def result_lines(summary: dict, run_dir: Path) -> list[str]:
    """What a finished run prints (`distfl train`, each point of a local sweep): the final and best test
    accuracy, the per-client accuracy where clients were evaluated, the privacy guarantee."""
    acc = summary["final_test_acc"]
    best = f"{100 * summary['best_test_acc']:.2f}% at round {summary['best_round']}" \
        if summary.get("best_test_acc") is not None else "no evaluation"
    phases = list(summary.get("phases") or {})
    # After a phase (TCT's stage 2, FFC) the final model is the phase's; `best_test_acc` stays the
    # best over the training rounds before it, so say so rather than call it the run's best.
    where = (f"after {' + '.join(phases)}; best of the {summary['rounds']} training rounds {best}"
             if phases else f"best {best}")
    final = f"{100 * acc:.2f}%" if acc is not None else "none"
    took = f" in {summary['wall_s']:.1f}s" if summary.get("wall_s") is not None else ""  # private: withheld
    lines = [f"final test accuracy {final} ({where}), {summary['rounds']} rounds{took}; "
             f"summary: {Path(run_dir) / 'summary.json'}"]
    if summary.get("rounds_without_reports") and summary["rounds_without_reports"] >= summary["rounds"]:
        lines.append(f"warning: no client reported in any of the {summary['rounds']} rounds (each was late, dropped "
                     "out or offline), so no client trained the model: check the system section (deadline, "
                     "dropout, availability)")
    clients = summary.get("final_client_acc")
    if clients:
        tuned = summary.get("client_finetune_epochs")
        how = f", each client's model fine-tuned {tuned} epoch(s) first" if tuned else ""
        how += f", the model after {' + '.join(phases)}" if phases else ""
        lines.append(f"per-client accuracy (eval.clients{how}): mean {100 * clients['mean']:.2f}%, std "
                     f"{100 * clients['std']:.2f}%, min {100 * clients['min']:.2f}%, p10 {100 * clients['p10']:.2f}%"
                     + (f", sample-weighted mean {100 * clients['weighted_mean']:.2f}%" if "weighted_mean" in clients
                        else "")
                     + (f"; {summary['clients_never_sampled']} client(s) never sampled"
                        if summary.get("clients_never_sampled") else ""))
    if summary.get("privacy"):
        from .privacy.accountant import guarantee

        lines.append(guarantee(summary["privacy"]))
    return lines
