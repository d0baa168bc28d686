"""What may change when a run resumes, and how a saved run's config is read back.

A resumed run (`distfl train --resume`, a sweep point with a checkpoint) must finish as the run it
continues would have: only keys that do not alter the finished model may change (RESUMABLE_KEYS), and a
saved config that predates a key is read at the value it ran with (PREVIOUS_DEFAULTS).
"""
from __future__ import annotations

from .config import config_to_dict, flatten_dict
from .config.renamed import upgraded
from .schema import Config

# Keys that may change when a run is resumed: they do not alter what the finished model will be.
# Keys of the phases after training (calibration.*, tct.*) may change until their phase starts:
# calibrate a finished run (`distfl calibrate RUN_DIR`), or try other stage-2 settings on a copy of a
# TCT run directory whose stage 1 is done. The runner refuses them once the phase has begun.
PHASE_KEYS = ("calibration.", "tct.")
RESUMABLE_KEYS = ("train.rounds", "eval.", "checkpoint.", "output.progress", "output.tensorboard",
                  "runtime.device", "runtime.threads", "runtime.deterministic", "runtime.pack_size",
                  *PHASE_KEYS)
# eval.* keys that may not change on resume: a holdout split removes samples from the clients' training data.
HOLDOUT_KEYS = ("eval.client_split", "eval.client_holdout")
# Keys whose default changed after they were added: the value a saved config that lacks the key ran with
# (it predates the key), where that differs from today's default.
PREVIOUS_DEFAULTS = {"tct.coordinate_order": "drawn", "runtime.channels_last": "off"}


def saved_values(saved: dict) -> dict:
    """A saved run's config (nested, as in its config.yaml or checkpoint), flat, in today's keys (old
    names read as their new ones), with every key it predates at the value it ran with: today's
    default, or its `PREVIOUS_DEFAULTS` entry."""
    return {**flatten_dict(config_to_dict(Config())), **PREVIOUS_DEFAULTS, **flatten_dict(upgraded(saved))}


def predated_keys_hint(changed: list[str]) -> str:
    """For blockers that the saved run predates: the overrides that resume it as it ran ('' if none)."""
    keys = [k for k in changed if k in PREVIOUS_DEFAULTS]
    if not keys:
        return ""
    return (f" (the run predates {', '.join(keys)}; add "
            f"{' '.join(f'{k}={PREVIOUS_DEFAULTS[k]}' for k in keys)} to resume it as it ran)")


def resume_blockers(saved: dict, now: dict) -> list[str]:
    """Dotted keys whose values differ between two config dicts and may not change on resume."""
    saved, now = saved_values(saved), flatten_dict(now)
    # A cosine lr is a function of train.rounds: more rounds would change the lr of rounds already trained.
    # eval.client_split and eval.client_holdout decide which samples the clients train on.
    fixed = ("train.rounds",) if "cosine" in (now["train.lr_schedule"], now["server.lr_schedule"]) else ()
    # privacy.target_epsilon calibrates the noise for train.rounds rounds: more rounds, other noise.
    fixed += ("train.rounds",) if now.get("privacy.target_epsilon", 0) > 0 else ()
    fixed += HOLDOUT_KEYS
    return [k for k in now if k != "output.dir" and saved.get(k) != now[k]
            and (k in fixed or not k.startswith(RESUMABLE_KEYS))]
