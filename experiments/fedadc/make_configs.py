"""Write configs/paper/fedadc/<method>.yaml = base.yaml + the method's algorithm keys.

distfl configs have no include mechanism, so each method file is a complete, runnable config;
this script keeps them in sync with base.yaml.   python experiments/fedadc/make_configs.py
"""
from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parents[1] / "configs" / "paper" / "fedadc"
BETA = 0.9

METHODS = {
    "fedavg": ("FedAvg (Algorithm 1): plain local SGD, uniform model average", {"name": "fedavg"}),
    "slowmo": ("SlowMo in FL form (Algorithm 2): server momentum beta on the pseudo-gradient, alpha = 1",
               {"name": "slowmo", "beta_global": BETA, "server_alpha": 1.0}),
    "fedadc_nesterov": ("FedADC (Algorithm 3, red/consecutive = Nesterov), beta_local = beta_global = beta, alpha = 1",
                        {"name": "fedadc", "variant": "nesterov", "beta_local": BETA, "beta_global": BETA,
                         "server_alpha": 1.0}),
    "fedadc_heavy_ball": ("FedADC (Algorithm 3, blue/simultaneous = heavy ball), beta_local = beta_global = beta",
                          {"name": "fedadc", "variant": "heavy_ball", "beta_local": BETA, "beta_global": BETA,
                           "server_alpha": 1.0}),
    "fedadc_plus": ("FedADC+ (§III): FedADC (Nesterov) + self-confidence KD, lambda = 0.35 (paper), tau = 1 (our choice)",
                    {"name": "fedadc", "variant": "nesterov", "beta_local": BETA, "beta_global": BETA,
                     "server_alpha": 1.0, "kd_lambda": 0.35, "kd_temperature": 1.0}),
}


def _scalar(v) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def main() -> None:
    base = yaml.safe_load((CONFIGS / "base.yaml").read_text())
    for name, (what, algorithm) in METHODS.items():
        cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}  # keeps base's order
        cfg["algorithm"] = {**algorithm, "weighting": base["algorithm"]["weighting"]}
        cfg["output"]["dir"] = f"runs/fedadc/{name}"
        header = (f"# {what}.\n# Generated from base.yaml by experiments/fedadc/make_configs.py; edit base.yaml "
                  f"and re-run it.\n#   python -m distfl train configs/paper/fedadc/{name}.yaml\n")
        text = header
        for section, values in cfg.items():
            if isinstance(values, dict):
                inner = ", ".join(f"{k}: {_scalar(v)}" for k, v in values.items())
                text += f"{section}: {{{inner}}}\n"
            else:
                text += f"{section}: {_scalar(values)}\n"
        (CONFIGS / f"{name}.yaml").write_text(text)
        print(CONFIGS / f"{name}.yaml")


if __name__ == "__main__":
    main()
