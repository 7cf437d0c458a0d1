"""Bad input against a real node (issue 12's benchmark): job files, config files and every
API route, with hypothesis-style random cases (tests/support/fuzzing.py says what is made
and what counts as a failure).

Starts a real standalone node (two simulated GPUs) and one temporary tenant; a fifth of the
cases are configs parsed in this process, a fifth requests on the node's socket as root,
three tenths on the socket as the tenant (a process of its own), the rest on the signed
network API as a tenant that joined with a key. Prints crashes, 5xx answers and state
changes after a refusal. Target: 0, 0, 0. Everything is removed at the end.

    python bench/fuzz.py [--cases 100000] [--seed 1] [--json]     (as root)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import run_as_root  # noqa: E402 (after the path is set)

UID_RANGE = (350000, 359999)


def run(cases: int, seed: int) -> dict:
    from tests.support.fuzzing import fuzz_node
    from tests.support.node import PYTHON, running_node
    from tests.support.users import remove_tenant_accounts, temp_user

    gpus = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]
    t0 = time.time()
    joined = None
    with tempfile.TemporaryDirectory(prefix="mtgpu-fuzz-") as tmp, temp_user("mtfz") as user, \
            running_node(gpus, CLUSTER_ID="fuzz-lab", TENANT_UID_RANGE=list(UID_RANGE)) as node:
        try:
            report = fuzz_node(node, user, cases, seed, tmp, PYTHON, str(ROOT))
            joined = getattr(report, "joined_tenant", None)
        finally:
            node.cancel_everything()
            node.terminate()
            remove_tenant_accounts([joined], UID_RANGE)
    out = {k: v for k, v in report.__dict__.items() if k not in ("joined_tenant", "tenants_unread")}
    out["seconds"] = round(time.time() - t0, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run_as_root("fuzz.py", "a real node and a real tenant", run, args.cases, args.seed)
    if isinstance(r, int):
        return r
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{r['cases']} cases in {r['seconds']} s: {r['refused']} refused, {r['accepted']} accepted")
    print(f"crashes {r['crashes']}, 5xx answers {r['server_errors']}, state changed after a refusal "
          f"{r['changed_after_refusal']}  [target 0, 0, 0]")
    if r["unchecked"]:
        print(f"NOT CHECKED: {r['unchecked']} refusals whose effect could not be compared (the tenants' list or "
              "the next job id could not be read)")
    for e in r["examples"]:
        print(f"  {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
