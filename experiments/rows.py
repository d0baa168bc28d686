"""Shared by the experiments' table.py scripts: reading a finished run, and checking that every number an
evidence row quotes is one the recomputed tables print (`table.py --check docs/evidence.md`)."""
from __future__ import annotations

import json
import re
from pathlib import Path

NUMBER = re.compile(r"[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?x?")


def load_run(runs: Path, name: str, seed: int, ended: bool = False) -> dict | None:
    """Run `runs/NAME_sSEED`'s summary, metrics rows and (where saved) command; None unless it completed
    (`ended`: or ended otherwise, e.g. diverged: its summary says how)."""
    run = runs / f"{name}_s{seed}"
    if not (run / "summary.json").exists():
        return None
    summary = json.loads((run / "summary.json").read_text())
    if summary["status"] != "completed" and not ended:
        return None
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    cmd = runs / f"{name}_s{seed}.cmd"
    return {"summary": summary, "metrics": metrics, "cmd": cmd.read_text().strip() if cmd.exists() else None}


def numbers(text: str) -> set[str]:
    return {n.replace("−", "-") for n in NUMBER.findall(text)}


def check_rows(evidence: Path, printed_text: str, rows: str, label: str) -> int:
    """Every number in the measured column ("ours") and the verdict of the evidence rows whose id matches
    the regex `rows` (e.g. "U[123]", named `label`: "U1-U3") must be one `printed_text` prints (a signed difference with its sign)."""
    printed = numbers(printed_text)
    printed |= {n.lstrip("+-") for n in printed}
    missing = []
    for line in evidence.read_text().splitlines():
        if not re.match(rf"\| {rows} \|", line):
            continue
        cells = line.split("|")
        row, ours = cells[1].strip(), cells[4] + cells[-2]
        missing += [f"{row}: {n}" for n in sorted(numbers(ours)) if n not in printed]
    print("\n".join(missing) if missing else
          f"every number in the measured column and the verdict of rows {label} is in the recomputed tables")
    return 1 if missing else 0
