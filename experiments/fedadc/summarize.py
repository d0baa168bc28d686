"""Tables for results.md from runs/fedadc/s<seed>_b<beta>/<method>/{metrics.jsonl,summary.json}.
   python experiments/fedadc/summarize.py > experiments/fedadc/tables.md   (also writes results.json)"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "runs" / "fedadc"
ORDER = ["fedavg", "slowmo", "fedadc_nesterov", "fedadc_heavy_ball", "fedadc_plus"]
LABEL = {"fedavg": "FedAvg", "slowmo": "SlowMo", "fedadc_nesterov": "FedADC (nesterov)",
         "fedadc_heavy_ball": "FedADC (heavy_ball)", "fedadc_plus": "FedADC+ (λ=0.35, τ=1)"}


def load(run: Path) -> dict | None:
    if not (run / "summary.json").exists():
        return None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    acc = {r["round"]: r["test_acc"] for r in rows if "test_acc" in r}
    s = json.loads((run / "summary.json").read_text())

    def first(th):
        return next((t for t in sorted(acc) if acc[t] >= th), None)

    return {"acc": acc, "final": s["final_test_acc"], "best": s["best_test_acc"], "best_round": s["best_round"],
            "r70": first(0.70), "r75": first(0.75), "wall_s": s["wall_s"], "sha": s["model_sha256"],
            "rounds": s["rounds"], "status": s["status"],
            "last4": sum(acc[t] for t in sorted(acc)[-4:]) / len(sorted(acc)[-4:])}


def fmt(x):
    return "—" if x is None else f"{100 * x:.2f}"


def main() -> None:
    out = {}
    for group in sorted(p for p in RUNS.glob("s*_b*") if p.is_dir()):
        res = {m: load(group / m) for m in ORDER}
        if res["fedavg"] is None:  # FedAvg has no beta: borrow the same seed's run from another beta
            seed = group.name.split("_")[0]
            other = next((p / "fedavg" for p in sorted(RUNS.glob(f"{seed}_b*")) if load(p / "fedavg")), None)
            res["fedavg"] = load(other) if other else None
        res = {m: r for m, r in res.items() if r is not None}
        if not res:
            continue
        out[group.name] = res
        print(f"\n### {group.name.replace('_', ', ').replace('s', 'seed ', 1).replace('b', 'β = ', 1)}\n")
        rounds = sorted(set().union(*(r["acc"] for r in res.values())))
        print("| round | " + " | ".join(LABEL[m] for m in res) + " |")
        print("|---:|" + "---:|" * len(res))
        for t in rounds:
            print(f"| {t} | " + " | ".join(fmt(r["acc"].get(t)) for r in res.values()) + " |")
        print("\n| method | rounds to 70% | rounds to 75% | best (round) | final (round 60) | mean of rounds 45-60 | wall s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for m, r in res.items():
            r70 = "not reached" if r["r70"] is None else r["r70"]
            r75 = "not reached" if r["r75"] is None else r["r75"]
            print(f"| {LABEL[m]} | {r70} | {r75} | {fmt(r['best'])} ({r['best_round']}) | {fmt(r['final'])} | "
                  f"{fmt(r['last4'])} | {r['wall_s']:.0f} |")
    betas = sorted({g.split("_")[1] for g in out})
    for beta in betas:
        groups = [g for g in out if g.endswith(beta)]
        if len(groups) < 2:
            continue
        print(f"\n### mean over seeds {', '.join(g.split('_')[0][1:] for g in groups)}, β = {beta[1:]}\n")
        print("| method | final acc per seed | mean final | mean best | mean of rounds 45-60 | rounds to 70% per seed | rounds to 75% per seed |")
        print("|---|---|---:|---:|---:|---|---|")
        for m in ORDER:
            rs = [out[g][m] for g in groups if m in out[g]]
            if len(rs) < len(groups):
                continue
            finals = " / ".join(fmt(r["final"]) for r in rs)
            r70 = " / ".join(str(r["r70"] or "—") for r in rs)
            r75 = " / ".join(str(r["r75"] or "—") for r in rs)
            mf = sum(r["final"] for r in rs) / len(rs)
            mb = sum(r["best"] for r in rs) / len(rs)
            ml = sum(r["last4"] for r in rs) / len(rs)
            print(f"| {LABEL[m]} | {finals} | {fmt(mf)} | {fmt(mb)} | {fmt(ml)} | {r70} | {r75} |")
    (Path(__file__).parent / "results.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
