"""`python -m distfl.bench --ceiling-worker SPEC`: one process of the runtime suite's hardware ceiling
(started by the bench itself)."""
import sys

from .runtime import ceiling_worker

if len(sys.argv) == 3 and sys.argv[1] == "--ceiling-worker":
    sys.exit(ceiling_worker(sys.argv[2]))
print("usage: distfl bench [--out FILE] [--rounds N] [--repeats N]  (this module's own entry is internal)",
      file=sys.stderr)
sys.exit(2)
