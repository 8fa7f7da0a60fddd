"""How much the CLI process grows, and how long it takes, on the bad inputs that once grew it without bound.

Runs every case of ``tests/test_bad_input.py``'s ``HEAVY`` list in one real CLI process (the same
measurement the test asserts under 200 MiB): before each case the kernel's high-water mark is reset
(5 written to ``/proc/self/clear_refs``), after it ``VmHWM`` minus the RSS at the start is the growth.

    python benchmarks/bad_input_growth.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    import test_bad_input as t
    from bad_input_cases import CASES, fill, materialize

    by_id = {c.id: c for c in CASES}
    argvs = []
    with tempfile.TemporaryDirectory() as d:
        for cid in t.HEAVY:
            folder = Path(d) / cid
            folder.mkdir()
            materialize(by_id[cid], folder)
            argvs.append(fill(by_id[cid], folder)[0])
        p = subprocess.run([sys.executable, "-c", t._MEASURE, json.dumps(argvs)], capture_output=True, text=True,
                           check=True)
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    print("| case | exit | growth | time |")
    print("|---|---|---|---|")
    for cid, r in zip(t.HEAVY, rows, strict=True):
        print(f"| `{cid}` | {r['code']} | {r['growth'] / 2**20:.2f} MiB | {r['s'] * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
