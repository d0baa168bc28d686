"""What may change when a run resumes, and how a saved run's config is read back.

A resumed run (`distfl train --resume`, a sweep point with a checkpoint) must finish as the run it
continues would have: only keys declared `resumable` (they do not alter the finished model) may change,
and a saved config that predates a key is read at the value it ran with (its `previous` default).
Keys of the phases after training (`resumable="phase"`: calibration.*, tct.*) may change until their
phase starts: calibrate a finished run (`distfl calibrate RUN_DIR`), or try other stage-2 settings on a
copy of a TCT run directory whose stage 1 is done. The runner refuses them once the phase has begun.
"""
from __future__ import annotations

from pathlib import Path

from distfl.config.load import config_to_dict
from distfl.config.renamed import upgraded
from distfl.config.schema import KEYS, SECTIONS, Config
from distfl.config.validate import key_applies
from distfl.config.values import flatten_dict
from distfl.errors import ConfigError


def _by_section(keys: list[str]) -> tuple[str, ...]:
    """`keys`, with a whole section written as "section." (the form the runner's checks match by prefix)."""
    out = []
    for key in keys:
        section = key.rpartition(".")[0]
        whole = section in SECTIONS and all(k in keys for k in KEYS if k.startswith(section + "."))
        name = f"{section}." if whole else key
        if name not in out:
            out.append(name)
    return tuple(out)


RESUMABLE_KEYS = _by_section([k for k, spec in KEYS.items() if spec.resumable])
PHASE_KEYS = _by_section([k for k, spec in KEYS.items() if spec.resumable == "phase"])
# Named in the runner's refusal: eval.* keys that may not change (a holdout split removes samples from
# the clients' training data); not resumable in their declarations.
HOLDOUT_KEYS = ("eval.client_split", "eval.client_holdout")
PREVIOUS_DEFAULTS = {k: spec.previous for k, spec in KEYS.items() if spec.previous is not None}


def saved_values(saved: dict) -> dict:
    """A saved run's config (nested, as in its config.yaml or checkpoint), flat, in today's keys (old
    names read as their new ones), with every key it predates at the value it ran with: today's
    default, or its `previous` one."""
    return {**flatten_dict(config_to_dict(Config())), **PREVIOUS_DEFAULTS, **flatten_dict(upgraded(saved))}


def with_previous_defaults(saved: dict) -> dict:
    """A saved nested config with each key it predates that may change on resume (so no blocker would
    name it) set to the value it ran with: a resumed run goes on as it ran (eval.finetune_optimizer)."""
    flat = flatten_dict(saved)
    for key, value in PREVIOUS_DEFAULTS.items():
        if key not in flat and KEYS[key].resumable:
            *path, last = key.split(".")
            section = saved
            for part in path:
                section = section.setdefault(part, {}) if isinstance(section, dict) else None
            if isinstance(section, dict):  # else not a config: loading it says what is wrong
                section[last] = value
    return saved


def saved_run_config(run_dir, flag: str) -> tuple[dict, Path]:
    """RUN_DIR/config.yaml as a resume reads it (`distfl train --resume`, `distfl.train(resume=...)`):
    nested, each key it predates at the value it ran with, output.dir the run directory; and its path.
    `flag` names the option in the error lines ("--resume" or "resume=")."""
    import yaml

    run_dir = Path(run_dir)
    saved = run_dir / "config.yaml"
    if not saved.exists():
        raise ConfigError(f"{flag}{'' if flag.endswith('=') else ' '}{run_dir}: no config.yaml there; is it a "
                          "distfl run directory?")
    restore = "it is the run's config as distfl wrote it: restore it (every checkpoint's state.pt holds it too)"
    try:
        base = yaml.safe_load(saved.read_text())
    except RecursionError:
        raise ConfigError(f"{flag.rstrip('=')}: cannot read {saved}: it is nested too deeply to be a distfl config; "
                          f"{restore}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{flag.rstrip('=')}: cannot read {saved}: {str(exc).splitlines()[0]}; {restore}") from None
    if not isinstance(base, dict):
        raise ConfigError(f"{flag.rstrip('=')}: {saved} is {'empty' if base is None else 'not a mapping of config keys'}; "
                          f"{restore}")
    base = with_previous_defaults(base)
    base.setdefault("output", {})["dir"] = str(run_dir)
    return base, saved


class Blockers(list):
    """The keys that block a resume (a list), with `why`: key -> the reason, for keys that may change on
    resume in other runs but not in this one (train.rounds of a private or cosine-schedule run)."""

    def __init__(self, keys=(), why: dict | None = None):
        super().__init__(keys)
        self.why = why or {}


def predated_keys_hint(changed: list[str]) -> str:
    """Why the blockers block where the reason is particular to this run (`Blockers.why`), and, for
    blockers that the saved run predates, the overrides that resume it as it ran ('' if neither)."""
    why = getattr(changed, "why", {})
    text = "".join(f" ({k} is fixed in this run: {why[k]})" for k in changed if k in why)
    keys = [k for k in changed if k in PREVIOUS_DEFAULTS]
    if not keys:
        return text
    return text + (f" (the run predates {', '.join(keys)}; add "
                   f"{' '.join(f'{k}={_text(PREVIOUS_DEFAULTS[k])}' for k in keys)} to resume it as it ran)")


def _text(value) -> str:
    """A value as an override writes it (booleans in YAML's spelling)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def resume_blockers(saved: dict, now: dict) -> list[str]:
    """Dotted keys whose values differ between two config dicts and may not change on resume."""
    saved, now = saved_values(saved), flatten_dict(now)
    why = {}
    if "cosine" in (now["train.lr_schedule"], now["server.lr_schedule"]):
        why["train.rounds"] = (f"the cosine lr schedule is a function of train.rounds "
                               f"({saved.get('train.rounds')}), so more rounds would change the lr of the rounds "
                               "already trained; start a new run with the rounds you want")
    if now.get("privacy.target_epsilon", 0) > 0:
        why["train.rounds"] = (f"privacy.target_epsilon={now['privacy.target_epsilon']:g} calibrated the noise "
                               f"to {saved.get('train.rounds')} rounds, and the rounds already trained used that "
                               "noise; more rounds would spend more privacy than the target. Start a new run with "
                               "the rounds you want (a run given privacy.noise_multiplier instead of a target may "
                               "be resumed with more rounds: its epsilon grows with them)")
    if now.get("privacy.mechanism") == "banded_mf":
        why["train.rounds"] = (f"privacy.mechanism=banded_mf factored the noise for all {saved.get('train.rounds')} "
                               "rounds, and the rounds already trained used that factorisation; start a new run "
                               "with the rounds you want")
    # A key that neither the saved run nor this one reads (its declared `applies`) cannot change the model.
    return Blockers([k for k in now if k != "output.dir" and saved.get(k) != now[k]
                     and (k in why or k not in KEYS or not KEYS[k].resumable)
                     and (key_applies(k, saved) or key_applies(k, now))], why)
