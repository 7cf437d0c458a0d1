"""Container jobs on real rootless Podman, as real tenants (issue 10): the tenant's uid
inside, its home read-write, datasets and the published Python environments read-only, the cache volume that outlives every
container, only its GPUs (CDI, simulated GPUs with real device nodes) in the main
process and in `podman exec`, cancel, time limit, exit status, a server restart, images
staged once and refused when not offered, an archive that fails its digest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support.images import busybox_image, busybox_rootfs, podman_missing
from tests.support.cluster import running_cluster
from tests.support.node import running_node, wait_for
from tests.support.runs import kill_server_and_shim, lines_of, running_marked_job
from tests.support.users import can_create_users

if can_create_users() or podman_missing():
    pytest.skip(can_create_users() or podman_missing(), allow_module_level=True)

GPUS2 = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]


@pytest.fixture(scope="module")
def image():
    with busybox_image() as name:
        yield name


@pytest.fixture(scope="module")
def datasets():
    d = Path(tempfile.mkdtemp(prefix="mtgpu-datasets-"))
    os.chmod(d, 0o755)
    (d / "imagenet.txt").write_text("pixels\n")
    os.chmod(d / "imagenet.txt", 0o644)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def interpreter():
    """A published Python environment (PYTHON_INTERPRETERS): a directory with an
    environment's layout and a module in its site-packages."""
    top = Path(tempfile.mkdtemp(prefix="mtgpu-python-"))
    os.chmod(top, 0o755)
    env = top / "py-env"
    site = env / "lib" / "python3" / "site-packages"
    site.mkdir(parents=True)
    (env / "bin").mkdir()
    (env / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "published_marker.py").write_text("PUBLISHED = True\n")
    for d in (env, env / "bin", env / "lib", env / "lib" / "python3", site):
        os.chmod(d, 0o755)
    for f in (env / "pyvenv.cfg", site / "published_marker.py"):
        os.chmod(f, 0o644)
    try:
        yield env
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def cnode(image, datasets, interpreter, alice, bob):
    # alice and bob first: a function-scoped `tenant` made before them would leave its uid
    # to one of them, and the node knows that uid as the earlier tenant's
    with running_node(GPUS2, DATASETS_DIRECTORIES=[str(datasets)], PYTHON_INTERPRETERS=[str(interpreter)],
                      CONTAINERS={"enabled": True, "images": [image]}) as node:
        wait_for("the image to be staged", lambda: image in _staged(node), timeout_s=120)
        yield node


def _staged(node, member: str = "node-a") -> dict:
    with node.client() as c:
        for n in c.nodes():
            if n["name"] == member:
                return (n.get("containers") or {}).get("staged") or {}
    return {}


def mt_podman(node, user, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return node.run_cli("mtgpu.cli.podman", user, *args, timeout_s=timeout_s)


def log_of(node, user, job_id: int) -> str:
    r = node.mt_job(user, "logs", str(job_id))
    assert r.returncode == 0, r.stderr
    return r.stdout


def container_of(node, user, job_id: int) -> str:
    def name():
        r = mt_podman(node, user, "ps", "--filter", f"label=mtgpu.job={job_id}", "--format", "{{.Names}}")
        return r.stdout.strip()
    return wait_for(f"the container of job {job_id}", name, timeout_s=30, interval_s=0.2)


def test_a_container_job_runs_as_the_tenant_with_its_home_datasets_and_cache(cnode, alice, image, datasets):
    script = (f"#MTGPU container={image}\n"
              "echo uid=$(id -u) gid=$(id -g) home=$HOME pwd=$(pwd)\n"
              "echo written > $HOME/from-container.txt\n"
              f"cat {datasets}/imagenet.txt\n"
              f"if echo x > {datasets}/new.txt; then echo dataset-writable; else echo dataset-read-only; fi\n"
              "mkdir -p $PIP_CACHE_DIR && echo cached > $PIP_CACHE_DIR/probe\n"
              "echo pip=$PIP_CACHE_DIR hf=$HF_HOME torch=$TORCH_HOME job=$MTGPU_JOB_ID\n")
    jid = cnode.submit_json(alice, script=script)["job_id"]
    job = cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)
    out = log_of(cnode, alice, jid)
    assert job["state"] == "completed", (job["reason"][:600], out)
    assert f"uid={alice.uid} gid={alice.gid} home={alice.home} pwd={alice.home}" in out
    f = Path(alice.home) / "from-container.txt"
    assert f.read_text() == "written\n" and (f.stat().st_uid, f.stat().st_gid) == (alice.uid, alice.gid)
    assert "pixels" in out and "dataset-read-only" in out and not (datasets / "new.txt").exists()
    assert f"pip=/mtgpu-cache/pip hf=/mtgpu-cache/huggingface torch=/mtgpu-cache/torch job={jid}" in out
    assert "container" in job.get("enforced", {}), job
    # The cache volume outlives the container: a second job reads what the first left.
    jid2 = cnode.submit_json(alice, "--container", image, "--wrap", "cat $PIP_CACHE_DIR/probe")["job_id"]
    job2 = cnode.wait_state(jid2, {"completed", "failed"}, timeout_s=60)
    assert job2["state"] == "completed" and "cached" in log_of(cnode, alice, jid2), (job2["reason"], log_of(cnode, alice, jid2))
    # Nothing is left behind: --rm, and no container of the tenant's remains.
    r = mt_podman(cnode, alice, "ps", "-a", "--format", "{{.Names}}")
    assert r.returncode == 0 and r.stdout.strip() == "", r


def test_a_container_job_sees_the_published_python_environment_read_only_at_its_own_path(cnode, alice, image,
                                                                                          interpreter):
    """A PYTHON_INTERPRETERS environment is bind-mounted read-only at the path it has on the
    node: the job reads it there; creating a file in it fails with EROFS (the mount is
    read-only, not only the files' modes) and changing one fails too (the kernel checks the
    file's mode first, so that one says EACCES), leaving the node's copy as it was."""
    env = interpreter
    marker = env / "lib" / "python3" / "site-packages" / "published_marker.py"
    script = (f"#MTGPU container={image}\n"
              f"cat {env}/pyvenv.cfg {marker}\n"
              f"awk -v p={env} '$2 == p {{ print \"options=\" $4 }}' /proc/mounts\n"
              f"if ( echo x > {env}/new.txt ) 2>/tmp/err; then echo created-writable; "
              "else echo \"create-refused: $(cat /tmp/err)\"; fi\n"
              f"if ( echo x >> {marker} ) 2>/tmp/err; then echo changed-writable; "
              "else echo \"change-refused: $(cat /tmp/err)\"; fi\n")
    jid = cnode.submit_json(alice, script=script)["job_id"]
    job = cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)
    out = log_of(cnode, alice, jid)
    assert job["state"] == "completed", (job["reason"][:600], out)
    assert "home = /usr/bin" in out and "PUBLISHED = True" in out, out  # visible at the node's path
    options = [line.split("=", 1)[1].split(",") for line in out.splitlines() if line.startswith("options=")]
    assert options and "ro" in options[0], out  # its own mount, read-only
    assert "created-writable" not in out and "changed-writable" not in out, out
    assert f"can't create {env}/new.txt: Read-only file system" in out, out
    assert "change-refused" in out, out
    assert not (env / "new.txt").exists() and marker.read_text() == "PUBLISHED = True\n"


def test_cpus_and_mem_become_the_containers_limits_and_its_shared_memory(cnode, alice, image):
    jid = cnode.submit_json(alice, "--container", image, "--cpus", "1", "--mem", "256M", "--wrap",
                            "df -k /dev/shm | tail -1")["job_id"]
    job = cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)
    out = log_of(cnode, alice, jid)
    assert job["state"] == "completed", (job["reason"], out)
    assert out.split()[1] == str(256 * 1024), out  # /dev/shm is the job's mem= (KiB)
    enforced = job["enforced"]
    assert enforced["memory"].startswith("cgroup") and enforced["cpu"].startswith("cgroup"), enforced
    assert "job's cgroup" in enforced["container_limits"]


def test_two_jobs_on_one_node_see_disjoint_gpus_in_the_main_process_and_in_exec(cnode, alice, image):
    flag = Path(alice.home) / "go-gpus"
    script = (f"#MTGPU container={image} gpus=1\n"
              "echo devices=$(ls /dev/mtgpu/* | tr '\\n' ' ') cuda=$CUDA_VISIBLE_DEVICES\n"
              f"while [ ! -e {flag} ]; do sleep 0.1; done\n")
    ids = [cnode.submit_json(alice, script=script)["job_id"] for _ in range(2)]
    try:
        for j in ids:
            try:
                wait_for(f"job {j} to print its devices", lambda j=j: "devices=" in log_of(cnode, alice, j),
                         timeout_s=90)
            except AssertionError as e:
                raise AssertionError(f"{e}: {cnode.job(j)}\n{cnode.server_log()[-2000:]}") from None
        seen = []
        for j in ids:
            job = cnode.job(j)
            gpu = job["gpus"][0]["index"]
            main = log_of(cnode, alice, j)
            assert f"devices=gpu{gpu} cuda=0" in main, main
            name = container_of(cnode, alice, j)
            r = mt_podman(cnode, alice, "exec", name, "sh", "-c", "echo $(ls /dev/mtgpu/*) $CUDA_VISIBLE_DEVICES")
            assert r.returncode == 0 and r.stdout.split() == [f"gpu{gpu}", "0"], r
            # the device node is real, with no driver behind it: ENXIO, not EPERM
            r = mt_podman(cnode, alice, "exec", name, "sh", "-c", f"cat /dev/mtgpu/*/gpu{gpu}")
            assert "No such device or address" in r.stderr, r
            seen.append(gpu)
        assert sorted(seen) == [0, 1]
    finally:
        flag.touch()
    for j in ids:
        assert cnode.wait_state(j, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
    flag.unlink()


def test_exit_status_cancel_and_time_limit_behave_as_for_native_jobs(cnode, alice, image):
    jid = cnode.submit_json(alice, "--container", image, "--wrap", "echo bye; exit 3")["job_id"]
    job = cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)
    assert job["state"] == "failed" and job["exit_code"] == 3 and "bye" in log_of(cnode, alice, jid)

    jid = cnode.submit_json(alice, "--container", image, "--wrap", "echo started; sleep 300")["job_id"]
    wait_for("the job to start", lambda: "started" in log_of(cnode, alice, jid), timeout_s=60)
    name = container_of(cnode, alice, jid)
    r = cnode.mt_job(alice, "cancel", str(jid))
    assert r.returncode == 0, r.stderr
    assert cnode.wait_state(jid, "cancelled", timeout_s=60)
    wait_for("the cancelled job's container to be removed",
             lambda: name not in mt_podman(cnode, alice, "ps", "-a", "--format", "{{.Names}}").stdout, timeout_s=30)

    jid = cnode.submit_json(alice, "--container", image, "--time", "3s", "--wrap", "echo started; sleep 300")["job_id"]
    job = cnode.wait_state(jid, {"failed", "completed", "cancelled"}, timeout_s=60)
    assert job["state"] == "failed" and "time limit" in job["reason"], job


def test_admins_see_which_members_run_containers_and_what_they_staged(cnode, image):
    r = cnode.admin("nodes")
    assert r.returncode == 0 and f"node-a: containers on; images staged: {image}" in r.stdout, r


def test_images_not_offered_are_refused_at_submit_and_nothing_is_queued(cnode, alice):
    before = {j["id"] for j in json.loads(cnode.mt_job(alice, "list", "--json").stdout)}
    r = cnode.mt_job(alice, "submit", "--container", "localhost/not-staged:1", "--wrap", "true")
    assert r.returncode == 2, r
    assert "localhost/not-staged:1" in r.stderr and "allow_user_images" in r.stderr and "staged" in r.stderr
    after = {j["id"] for j in json.loads(cnode.mt_job(alice, "list", "--json").stdout)}
    assert after == before


def test_a_server_restart_reattaches_a_running_container_and_removes_one_left_behind(cnode, alice, image):
    flag = Path(alice.home) / "go-restart"
    jid = cnode.submit_json(alice, "--container", image, "--wrap",
                            f"echo started; while [ ! -e {flag} ]; do sleep 0.1; done; echo finished; exit 7")["job_id"]
    wait_for("the job to start", lambda: "started" in log_of(cnode, alice, jid), timeout_s=60)
    name = container_of(cnode, alice, jid)
    # a container of this node that no run owns (as a crash between start and record could leave)
    r = mt_podman(cnode, alice, "create", "--pull=never", "--label", "mtgpu.node=node-a", "--label", "mtgpu.run=gone",
                  "--name", "mtgpu-orphan", image, "true")
    assert r.returncode == 0, r
    cnode.kill9()
    cnode.start()
    assert cnode.job(jid)["state"] == "running"
    try:
        wait_for("the orphan to be removed",
                 lambda: "mtgpu-orphan" not in mt_podman(cnode, alice, "ps", "-a", "--format", "{{.Names}}").stdout,
                 timeout_s=60)
    except AssertionError:
        raise AssertionError(cnode.server_log()[-3000:]) from None
    assert name in mt_podman(cnode, alice, "ps", "--format", "{{.Names}}").stdout  # the job's own still runs
    flag.touch()
    job = cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)
    flag.unlink()
    assert job["exit_code"] == 7 and "finished" in log_of(cnode, alice, jid)


def test_a_container_job_that_outlived_its_killed_supervisor_ends_with_its_own_status_and_runs_once(
        cnode, alice, image):
    with running_marked_job(cnode, alice, f"container={image}", shell="/bin/sh", then="exit 5\n",
                            timeout_s=60) as (jid, marker, flag):
        kill_server_and_shim(cnode, jid)  # podman's client and the container run on, under the job's keeper
        cnode.start()
        assert cnode.job(jid)["state"] == "running"
        flag.touch()
        job = cnode.wait_state(jid, {"completed", "failed", "lost", "queued"}, timeout_s=60)
        assert job["state"] == "failed" and job["exit_code"] == 5 and job["history"] == [], job
        assert lines_of(marker) == ["run"]


def test_an_archive_that_fails_its_digest_is_never_loaded(cnode, tenant, image):
    archives = list((cnode.state_dir / "images").glob("sha256-*.tar"))
    assert len(archives) == 1
    archive = archives[0]
    saved = archive.read_bytes()
    try:
        with open(archive, "ab") as f:
            f.write(b"tampered")
        jid = cnode.submit_json(tenant, "--container", image, "--wrap", "echo ran")["job_id"]
        job = cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)
        assert job["state"] == "failed" and "digest" in job["reason"] and "never loaded" in job["reason"], job
        r = mt_podman(cnode, tenant, "images", "--format", "{{.Repository}}")
        assert r.returncode == 0 and image.split(":")[0] not in r.stdout, r
    finally:
        archive.write_bytes(saved)
    jid = cnode.submit_json(tenant, "--container", image, "--wrap", "echo ran")["job_id"]
    assert cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"


def test_mt_podman_is_the_tenants_own_store_and_another_tenant_sees_nothing_of_it(cnode, alice, bob, image):
    assert mt_podman(cnode, alice, "image", "exists", image).returncode == 0  # loaded by alice's jobs
    r = mt_podman(cnode, bob, "images", "--format", "{{.Repository}}")
    assert r.returncode == 0 and image.split(":")[0] not in r.stdout
    r = mt_podman(cnode, bob, "ps", "-a", "--format", "{{.Names}}")
    assert r.returncode == 0 and r.stdout.strip() == ""
    store = cnode.state_dir / "podman" / "users" / str(alice.uid) / "storage"
    r = mt_podman(cnode, alice, "info", "--format", "{{.Store.GraphRoot}}")
    assert r.returncode == 0 and r.stdout.strip() == str(store), r  # node-local, not in the home
    in_home = Path(alice.home) / ".local" / "share" / "containers"
    assert not (in_home / "storage" / "overlay").exists(), sorted(str(p) for p in in_home.rglob("*"))[:20]
    r = subprocess.run(["ls", str(store)], user=bob.uid, group=bob.gid, extra_groups=[], capture_output=True, text=True)
    assert r.returncode != 0 and "Permission denied" in r.stderr


def test_a_member_without_the_image_fetches_it_verified_and_gangs_and_arrays_run_in_containers(alice, image):
    """Per-node layout: m0 stages the image, m1 has none; a job placed on m1 waits while m1
    fetches the archive from m0 (signed, streamed, digest verified), then runs. A gang
    (nodes=2, host network) reaches its rendezvous port from the other member; an array
    runs one container per index."""
    one = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]
    with running_cluster(2, gpus=[one, one], settings=[{"CONTAINERS": {"enabled": True, "images": [image]}},
                                                       {"CONTAINERS": {"enabled": True}}]) as cl:
        m0, m1 = cl.members
        wait_for("m0 to stage the image", lambda: image in _staged(m1, "m0"), timeout_s=120)
        jid = m1.submit_json(alice, "--container", image, "--server", "m1", "--wrap", "echo on $MTGPU_NODE")["job_id"]
        job = m1.wait_state(jid, {"completed", "failed"}, timeout_s=120)
        assert job["state"] == "completed" and "on m1" in log_of(m1, alice, jid), job["reason"]
        assert "fetched from m0 and verified" in m1.server_log()
        digests = [sorted(p.name for p in (m.state_dir / "images").glob("sha256-*.tar")) for m in (m0, m1)]
        assert digests[0] == digests[1] and len(digests[0]) == 1
        wait_for("m1 to offer the image too", lambda: image in _staged(m0, "m1"), timeout_s=30)

        # Rank 0 listens on the rendezvous port until rank 1's line arrives (a connection
        # without it, e.g. one made before it listened, is ignored), then acknowledges in the
        # shared home; rank 1 sends until acknowledged. Both bounded.
        gang = (f"#MTGPU container={image} nodes=2 gpus=1\n"
                "got=$HOME/gang-$MTGPU_JOB_ID; ack=$HOME/gang-ack-$MTGPU_JOB_ID\n"
                "if [ $MTGPU_NODE_RANK = 0 ]; then\n"
                "  for i in $(seq 1 60); do timeout 5 nc -l -p $MASTER_PORT > $got; "
                "grep -q hello-from-rank1 $got && break; done; cat $got; touch $ack\n"
                "else\n"
                "  for i in $(seq 1 300); do [ -e $ack ] && break; echo hello-from-rank1 | nc $MASTER_ADDR $MASTER_PORT; "
                "sleep 0.2; done\n"
                "fi\n"
                "echo rank=$MTGPU_NODE_RANK of $MTGPU_NNODES on $MTGPU_NODE\n")
        jid = m0.submit_json(alice, script=gang)["job_id"]
        job = m0.wait_state(jid, {"completed", "failed"}, timeout_s=120)
        rank0 = log_of(m0, alice, jid)
        assert job["state"] == "completed" and "hello-from-rank1" in rank0, (job["reason"], rank0)
        r = m0.mt_job(alice, "logs", "--rank", "1", str(jid))
        assert "rank=1 of 2" in r.stdout, r

        arr = m0.submit_json(alice, "--container", image, "--array", "0-3", "--wrap", "echo idx=$MTGPU_ARRAY_INDEX")
        for i, j in enumerate(arr["job_ids"]):
            assert m0.wait_state(j, {"completed", "failed"}, timeout_s=120)["state"] == "completed"
            assert f"idx={i}" in log_of(m0, alice, j)


def test_with_allow_user_images_a_tenants_own_image_runs_and_a_missing_one_is_refused_at_submit(tenant, base):
    """The tenant's own store on the member taking the request is looked at (as the tenant):
    an image it does not hold, and the cluster does not offer, is refused before it queues."""
    with running_node(GPUS2, CONTAINERS={"enabled": True, "allow_user_images": True}) as node:
        rootfs = busybox_rootfs(base / "rootfs")
        tar = base / "own.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        os.chmod(tar, 0o644)
        r = mt_podman(node, tenant, "import", str(tar), "localhost/my-own:1")
        assert r.returncode == 0, r
        jid = node.submit_json(tenant, "--container", "localhost/my-own:1", "--wrap", "echo mine")["job_id"]
        job = node.wait_state(jid, {"completed", "failed"}, timeout_s=60)
        assert job["state"] == "completed" and "mine" in log_of(node, tenant, jid), job["reason"]
        assert job["spec"]["server"] == "node-a"  # pinned where its store holds the image
        before = {j["id"] for j in json.loads(node.mt_job(tenant, "list", "--json").stdout)}
        r = node.mt_job(tenant, "submit", "--container", "localhost/not-there:1", "--wrap", "echo never")
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert "localhost/not-there:1" in r.stderr and "own store on node-a" in r.stderr, r.stderr
        assert "mt-podman load -i FILE.tar" in r.stderr and "offers" in r.stderr, r.stderr
        assert {j["id"] for j in json.loads(node.mt_job(tenant, "list", "--json").stdout)} == before
        # a workspace in it too, before anything is reserved
        r = node.run_cli("mtgpu.cli.container", tenant, "create", "--image", "localhost/not-there:1")
        assert r.returncode == 2 and "localhost/not-there:1" in r.stderr and "own store" in r.stderr, r.stderr
        # a name podman would read as an option, or refuse itself: refused naming it, before podman is asked
        r = node.mt_job(tenant, "submit", "--container", "Foo:1", "--wrap", "echo never")
        assert r.returncode == 2 and "'Foo' is not in lower case" in r.stderr, (r.returncode, r.stderr)
        r = node.run_cli("mtgpu.cli.container", tenant, "create", "--image=--help")
        assert r.returncode == 2 and "image '--help' is not an image name" in r.stderr, (r.returncode, r.stderr)


def test_a_tenants_own_image_is_looked_for_on_the_member_taking_the_request_and_the_job_pinned_there(alice, base):
    """Stores are per member: m0 holds the image, so a job submitted there runs there (and
    says so, m1 allowing tenants' images too); submitted on m1 it is refused naming m1,
    unless it names server=m0, which m1 cannot check (it runs on m0)."""
    conf = {"CONTAINERS": {"enabled": True, "allow_user_images": True}}
    with running_cluster(2, settings=[conf, conf], gpus=[[], []]) as cl:
        m0, m1 = cl.members

        def both_registered(m):
            with m.client() as c:
                nodes = c.nodes()
            return len(nodes) == 2 and all((n.get("containers") or {}).get("user_images") for n in nodes)
        for m in (m0, m1):
            wait_for("both members' containers in its view", lambda m=m: both_registered(m), timeout_s=60)
        rootfs = busybox_rootfs(base / "rootfs")
        tar = base / "own.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
        os.chmod(tar, 0o644)
        assert mt_podman(m0, alice, "import", str(tar), "localhost/on-m0:1").returncode == 0
        r = m0.mt_job(alice, "submit", "--json", "--container", "localhost/on-m0:1", "--wrap", "echo on $MTGPU_NODE")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "your own image, in your store on m0: the job runs there" in r.stderr, r.stderr
        job = m0.wait_state(json.loads(r.stdout)["job_id"], {"completed", "failed"}, timeout_s=120)
        assert job["state"] == "completed" and job["spec"]["server"] == "m0", job
        r = m1.mt_job(alice, "submit", "--container", "localhost/on-m0:1", "--wrap", "true")
        assert r.returncode == 2 and "own store on m1" in r.stderr and "server=MEMBER" in r.stderr, r.stderr
        jid = m1.submit_json(alice, "--container", "localhost/on-m0:1", "--server", "m0", "--wrap",
                             "echo on $MTGPU_NODE")["job_id"]
        job = m1.wait_state(jid, {"completed", "failed"}, timeout_s=120)
        assert job["state"] == "completed" and "on m0" in log_of(m0, alice, jid), job["reason"]


def test_a_tenant_cannot_put_its_own_content_under_a_staged_images_name(cnode, bob, image):
    """allow_user_images = false holds: a job in a staged image runs it by its id, so a
    tenant that commits other content under the same name in its own store still gets
    the staged image."""
    script = "cat /marker 2>/dev/null || echo no-marker\n"
    jid = cnode.submit_json(bob, "--container", image, "--wrap", script)["job_id"]
    assert cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
    assert "no-marker" in log_of(cnode, bob, jid)
    r = mt_podman(cnode, bob, "run", "--pull=never", "--name", "own", image, "sh", "-c", "echo tenant-own > /marker")
    assert r.returncode == 0, r
    r = mt_podman(cnode, bob, "commit", "own", image)
    assert r.returncode == 0, r
    jid = cnode.submit_json(bob, "--container", image, "--wrap", script)["job_id"]
    assert cnode.wait_state(jid, {"completed", "failed"}, timeout_s=60)["state"] == "completed"
    out = log_of(cnode, bob, jid)
    assert "no-marker" in out and "tenant-own" not in out


def test_with_shared_homes_an_image_is_archived_once_on_the_shared_storage_for_every_member(alice, image):
    with running_cluster(2, settings=[{"HOME_LAYOUT": "shared", "CONTAINERS": {"enabled": True, "images": [image]}}] * 2,
                         gpus=[[], []]) as cl:
        m0, m1 = cl.members
        for m in ("m0", "m1"):
            wait_for(f"{m} to stage the image", lambda m=m: image in _staged(m0, m), timeout_s=120)
        shared = cl.base / "homes" / ".mtgpu-images"
        archives = list(shared.glob("sha256-*.tar"))
        assert len(archives) == 1 and _staged(m0, "m0")[image] == _staged(m0, "m1")[image], archives
        assert not list((m0.state_dir / "images").glob("*.tar")) and not list((m1.state_dir / "images").glob("*.tar"))
        jid = m0.submit_json(alice, "--container", image, "--server", "m1", "--wrap", "echo on $MTGPU_NODE")["job_id"]
        job = m0.wait_state(jid, {"completed", "failed"}, timeout_s=120)
        assert job["state"] == "completed" and "on m1" in log_of(m0, alice, jid), job["reason"]
        assert "fetched from" not in m1.server_log()


def test_a_preempted_container_job_gets_sigterm_inside_its_container_and_is_requeued(cnode, alice, image):
    """Preemption (docs/SCHEDULING.md): the SIGTERM reaches the job's process in its
    container (through `podman run`), which checkpoints and exits well before the grace."""
    over = []
    for _ in range(2):  # one oversubscribed job on each of the node's two GPUs
        script = ("trap 'echo got-term; exit 0' TERM; echo started-$MTGPU_JOB_ID; "
                  "while true; do sleep 0.1; done")
        over.append(cnode.submit_json(alice, "--container", image, "--gpus", "1", "--gpu-mode", "oversubscribe",
                                      "--wrap", script)["job_id"])
        wait_for("the oversubscribed job to start", lambda j=over[-1]: "started" in log_of(cnode, alice, j),
                 timeout_s=60)
    guaranteed = cnode.submit_json(alice, "--container", image, "--gpus", "1", "--wrap", "echo exclusive")["job_id"]
    try:
        cnode.wait_state(guaranteed, "completed", timeout_s=90)
        victim = cnode.job(over[1])  # the younger one
        assert victim["history"] and victim["history"][0]["preempted_by"] == guaranteed, victim
        assert "exited with status 0" in victim["history"][0]["outcome"], victim["history"]  # its trap, not a kill
        assert cnode.job(over[0])["attempt"] == 0 and not cnode.job(over[0]).get("preempted")
    finally:
        for j in over:
            cnode.mt_job(alice, "cancel", str(j))
        for j in over:
            cnode.wait_state(j, "cancelled", timeout_s=60)
