"""Epsilon from pfl-research 0.6's own accountants for the noise multipliers of docs/privacy.md's evidence
runs (Poisson sampling q = 100 / 3000, 100 rounds, delta 1e-5; multipliers calibrated by distfl's RDP
accountant for epsilon 1, 2, 4, 8). Run with a Python that has `pfl==0.6.0` installed (not distfl's venv):
    python bench/pfl_privacy_epsilon.py
"""
import json

from pfl.privacy import PLDPrivacyAccountant, RDPPrivacyAccountant

Q, ROUNDS, DELTA = 100 / 3000, 100, 1e-5
CALIBRATED = [(1, 1.702), (2, 1.162), (4, 0.859), (8, 0.652)]  # (distfl's target epsilon, its multiplier)


def main() -> None:
    out = {}
    for target, z in CALIBRATED:
        row = {"noise_multiplier": z}
        for name, cls in (("rdp", RDPPrivacyAccountant), ("pld", PLDPrivacyAccountant)):
            accountant = cls(num_compositions=ROUNDS, sampling_probability=Q, mechanism="gaussian", delta=DELTA,
                             noise_parameter=z)
            row[f"pfl_{name}_epsilon"] = accountant.epsilon
        out[str(target)] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
