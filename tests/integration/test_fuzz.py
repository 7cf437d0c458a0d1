"""Bad input never crashes a node (issue 12): a small deterministic set of the fuzz cases
of bench/fuzz.py (tests/support/fuzzing.py) against a real node: job files, configs and
every API route, on the socket as root and as a tenant, and signed on the network."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.fuzzing import fuzz_node
from tests.support.node import running_node
from tests.support.users import stop_node_and_remove_tenants

UID_RANGE = (350000, 359999)
ROOT = Path(__file__).resolve().parents[2]


def test_a_deterministic_set_of_bad_inputs_gets_refusals_never_a_crash_a_5xx_or_a_change(alice, tmp_path):
    gpus = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]
    with running_node(gpus, CLUSTER_ID="fuzz-lab", TENANT_UID_RANGE=list(UID_RANGE)) as node:
        report = None
        try:
            report = fuzz_node(node, alice, 600, 7, tmp_path, sys.executable, str(ROOT))
        finally:
            stop_node_and_remove_tenants(node, [getattr(report, "joined_tenant", None)], UID_RANGE)
    assert report.cases >= 600 and report.refused > 0
    assert (report.crashes, report.server_errors, report.changed_after_refusal) == (0, 0, 0), report.examples
    assert report.unchecked == 0, "every refusal's effect is compared"
