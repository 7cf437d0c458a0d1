"""Boundaries between tenants' jobs on one node (issue 12), with real processes of real
users: a native job opens only its own GPUs' device nodes, whatever it sets in its
environment (simulated GPUs have real device nodes of their own: opening one gives
ENXIO, no driver; a fenced one EPERM); a shared-mode job above its VRAM reservation is
stopped before its neighbours are hurt (the simulated backend's per-process figures)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mtgpu.agent.podman.cdi import sim_device_path, spec_name
from mtgpu.agent.podman.tenant import PodmanHost
from tests.support.node import running_node, wait_for
from tests.support.users import can_create_users

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)

GPUS2 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]
OPEN_BOTH = """#!/bin/bash
#MTGPU gpus=1
export CUDA_VISIBLE_DEVICES=0,1 NVIDIA_VISIBLE_DEVICES=all   # the job asks for both: it must not matter
for i in 0 1; do
  python3 - "$i" "{paths}" <<'EOF'
import errno, sys
i, paths = int(sys.argv[1]), sys.argv[2].split(",")
try:
    open(paths[i], "rb").close()
    print(f"gpu{{i}} opened")
except OSError as e:
    print(f"gpu{{i}} {{errno.errorcode[e.errno]}}")
EOF
done
"""


@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup/devices"), reason="device fencing here is cgroup v1's")
def test_a_native_job_opens_its_own_gpu_and_is_denied_the_other_whatever_its_environment_says(alice):
    with running_node(GPUS2) as node:
        name = spec_name("node-a", PodmanHost(node.state_dir).key)
        paths = ",".join(sim_device_path(name, i) for i in range(2))
        jid = node.submit_json(alice, script=OPEN_BOTH.format(paths=paths))["job_id"]
        job = node.wait_state(jid, {"completed", "failed"}, timeout_s=60)
        out = node.mt_job(alice, "logs", str(jid)).stdout
        assert job["state"] == "completed", (job["reason"], out)
        mine = job["gpus"][0]["index"]
        other = 1 - mine
        assert f"gpu{mine} ENXIO" in out and f"gpu{other} EPERM" in out, out  # own: no driver; other: fenced
        assert job["enforced"]["devices"].startswith("cgroup-v1"), job["enforced"]


VRAM_JOB = "#!/bin/bash\n#MTGPU gpus=1 gpu-mode=shared vram=8G\necho $$ > $HOME/pid-$MTGPU_JOB_ID\nsleep 600\n"


def test_a_shared_job_above_its_vram_reservation_is_stopped_with_the_figures_and_its_neighbour_runs_on(alice, bob):
    from mtgpu.agent.telemetry.simulated import default_override_path, write_simulated_load

    one = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]
    with running_node(one, GPU_POLICY={"vram_grace": "2s"}) as node:
        a = node.submit_json(alice, script=VRAM_JOB)["job_id"]
        b = node.submit_json(bob, script=VRAM_JOB)["job_id"]
        pids = {}
        for user, jid in ((alice, a), (bob, b)):
            node.wait_state(jid, "running", timeout_s=60)
            path = Path(user.home) / f"pid-{jid}"
            pids[jid] = int(wait_for(f"job {jid}'s pid", lambda p=path: p.exists() and p.read_text().strip()))
        assert node.job(a)["gpus"][0]["index"] == node.job(b)["gpus"][0]["index"] == 0  # both on the one GPU
        write_simulated_load(default_override_path(node.state_dir), 0, processes=[
            {"pid": pids[a], "used_vram_bytes": 12 << 30, "name": "greedy"},
            {"pid": pids[b], "used_vram_bytes": 4 << 30, "name": "modest"}])
        job = node.wait_state(a, {"completed", "failed"}, timeout_s=60)
        assert job["state"] == "failed", job
        assert job["reason"].startswith("used 12G of VRAM on GPU 0, above the 8G it reserved"), job["reason"]
        assert "more than 2s: stopped" in job["reason"] and "larger vram=" in job["reason"], job["reason"]
        assert node.job(b)["state"] == "running"  # the neighbour within its reservation runs on
