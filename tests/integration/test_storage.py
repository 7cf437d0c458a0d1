"""Shared data, measured disk usage and mt-python, with real tenants (temp_user).

A published dataset directory is readable and not writable by a real tenant; measured
usage of a real tree matches du; `mt-python` lists and runs a published interpreter (a
venv of /usr/bin/python3) as a real tenant. Every directory is removed at teardown and
temp_user removes its users even when a test fails.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mtgpu.storage.quota import MeasuredUsage, check_submission
from mtgpu.storage.shared import check_read_only, fixed_lines, interpreter_publish_root, problem_lines, publish_read_only

if sys.platform != "linux" or os.geteuid() != 0:
    pytest.skip("publishing to root and running tenants need Linux and root", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "mtgpu.cli.python"]


def as_tenant(user, cmd, **kwargs) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": user.home, "LANG": "C.UTF-8", **kwargs.pop("env", {})}
    return subprocess.run(cmd, user=user.uid, group=user.gid, extra_groups=[], env=env, capture_output=True,
                          text=True, timeout=60, **kwargs)


def test_a_published_dataset_is_readable_but_not_writable_by_a_tenant(base, tenant):
    data = base / "datasets"
    (data / "imagenet").mkdir(parents=True)
    sample = data / "imagenet" / "sample.txt"
    sample.write_text("pixels\n")
    # as if copied in carelessly by the tenant: its files, writable by everyone
    for p, mode in ((data, 0o777), (data / "imagenet", 0o775), (sample, 0o666)):
        os.chown(p, tenant.uid, tenant.gid)
        os.chmod(p, mode)
    assert check_read_only(data)
    lines = publish_read_only([data])
    assert problem_lines(lines) == [] and len(fixed_lines(lines)) == 3
    assert check_read_only(data) == []

    assert as_tenant(tenant, ["cat", str(sample)]).stdout == "pixels\n"
    assert as_tenant(tenant, ["ls", str(data / "imagenet")]).stdout.split() == ["sample.txt"]
    for cmd in (["touch", str(data / "new")], ["sh", "-c", f"echo more >> {sample}"], ["rm", "-f", str(sample)],
                ["chmod", "777", str(sample)], ["mkdir", str(data / "imagenet" / "d")]):
        r = as_tenant(tenant, cmd)
        assert r.returncode != 0, f"{cmd} succeeded as the tenant"
    assert sample.read_text() == "pixels\n" and not (data / "new").exists()


def test_measured_usage_of_a_real_tree_matches_du(base):
    home = base / "homes" / "alice"
    (home / "a" / "b").mkdir(parents=True)
    (home / "small").write_bytes(b"x" * 10)
    (home / "a" / "mid").write_bytes(os.urandom(300_000))
    (home / "a" / "b" / "big").write_bytes(os.urandom(2_000_000))
    with open(home / "sparse", "wb") as f:  # 50 MB apparent, almost nothing allocated
        f.seek(50_000_000)
        f.write(b"end")
    os.link(home / "a" / "mid", home / "mid-again")
    os.symlink("/usr", home / "usr-link")
    os.sync()
    reading = MeasuredUsage(base / "homes").usage("alice", 0, now=100.0)
    du = subprocess.run(["du", "-s", "-B1", "-x", str(home)], capture_output=True, text=True, check=True)
    du_bytes = int(du.stdout.split()[0])
    assert reading.complete and reading.problems == ()
    assert abs(reading.used_bytes - du_bytes) <= 4096, (reading.used_bytes, du_bytes)
    assert 2_300_000 <= reading.used_bytes < 3_000_000
    refusal = check_submission("alice", reading.used_bytes, 2_000_000, home)
    assert refusal is not None and refusal.startswith("disk quota exceeded: 2.") and "of 1.9M (USER_DISK_LIMIT)" in refusal
    assert check_submission("alice", reading.used_bytes, 10_000_000, home) is None


@pytest.fixture
def published_python(base):
    env = base / "envs" / "py311"
    r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(env)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot make a venv of /usr/bin/python3: {r.stderr.strip()}")
    lines = publish_read_only([interpreter_publish_root(env / "bin" / "python3")])
    assert problem_lines(lines) == [], lines
    config = base / "mtgpu.toml"
    config.write_text(
        f'NODE_NAME = "storage-test"\nSTATE_DIR = "{base}/state"\n'
        f'PYTHON_INTERPRETERS = [{{ name = "py311", path = "{env}" }}, "/usr/bin/python3"]\n'
    )
    os.chmod(config, 0o644)
    return env, config


def test_mt_python_lists_and_runs_a_published_interpreter_as_a_tenant(published_python, tenant):
    env, config = published_python
    run_env = {"MTGPU_CONFIG": str(config), "PYTHONPATH": str(REPO)}
    listed = as_tenant(tenant, [*CLI, "list", "--json"], env=run_env, cwd=tenant.home)
    assert listed.returncode == 0, listed.stderr
    docs = {d["name"]: d for d in json.loads(listed.stdout)}
    assert set(docs) == {"py311", "usr"}
    assert docs["py311"]["path"] == str(env) and docs["py311"]["executable"] == str(env / "bin" / "python3")
    assert docs["py311"]["version"].startswith("3.") and docs["py311"]["error"] is None

    ran = as_tenant(tenant, [*CLI, "run", "py311", "--", "-c", "import os,sys;print(sys.prefix, os.getuid(), sys.argv[1:])",
                             "one", "--two"], env=run_env, cwd=tenant.home)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split(" ", 2)[:2] == [str(env), str(tenant.uid)]
    assert "['one', '--two']" in ran.stdout

    code = as_tenant(tenant, [*CLI, "run", "py311", "--", "-c", "raise SystemExit(7)"], env=run_env, cwd=tenant.home)
    assert code.returncode == 7  # the interpreter's own exit status

    unknown = as_tenant(tenant, [*CLI, "run", "torch", "--", "-c", "1"], env=run_env, cwd=tenant.home)
    assert unknown.returncode == 2
    assert "no interpreter named 'torch'; the published interpreters are: py311, usr" in unknown.stderr

    # the environment is read-only for the tenant
    wrote = as_tenant(tenant, ["touch", str(env / "bin" / "evil")], cwd=tenant.home)
    assert wrote.returncode != 0 and not (env / "bin" / "evil").exists()
    st = os.stat(env / "pyvenv.cfg")
    assert st.st_uid == 0 and not stat.S_IMODE(st.st_mode) & 0o022


def test_mt_python_with_a_broken_config_says_what_is_wrong(base, tenant):
    config = base / "bad.toml"
    config.write_text("PYTHON_INTERPRETERS = 3\n")
    os.chmod(config, 0o644)
    r = as_tenant(tenant, [*CLI, "list"], env={"MTGPU_CONFIG": str(config), "PYTHONPATH": str(REPO)},
                  cwd=tenant.home)
    assert r.returncode == 1 and "PYTHON_INTERPRETERS" in r.stderr
