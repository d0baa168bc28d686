"""Errors that distfl reports to the user as a one-paragraph message, without a traceback."""


class DistflError(Exception):
    """Base class: the CLI prints the message and exits with status 2."""


class ConfigError(DistflError):
    """A config key, value or combination is invalid. The message names the key and what is valid."""


class DataError(DistflError):
    """A dataset cannot be found or read, or a partition cannot be built."""


class CheckpointError(DistflError):
    """A checkpoint is missing, corrupt, or does not match the config."""


class RankDisagreement(DistflError):
    """Ranks hold different configs, partitions or initial models; training would drift apart."""


class DivergenceError(DistflError):
    """Training produced a non-finite loss or model; the message names the round."""


class PluginError(RuntimeError):
    """A method misuses the algorithm API mid-run (a statistic added to a segment it never declared, a
    value its segment cannot hold). Not a DistflError: the run ends as a failure whose one line is this
    message, with the traceback (pointing into the method's code) saved in RUN_DIR/error.log."""


class NothingReports(DistflError):
    """An asynchronous run in which no update can reach the server's buffer within the horizon of
    docs/system.md (every client drops out, is never online, or reports only when offline): the run stops
    as failed, its summary.json saying why in one line, its checkpoints kept."""


class Interrupted(DistflError):
    """A stop signal (SIGTERM, SIGUSR1: preemption or time limit) arrived; a checkpoint was written and
    `distfl train --resume RUN_DIR` continues without losing a round. The run is not finished: its
    summary.json says "stopped" and the CLI exits 3. The message is the stop's one line."""
