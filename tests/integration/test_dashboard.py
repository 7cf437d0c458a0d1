"""The web dashboard on a real node (issue 15), in headless Chromium (Debian's chromium and
chromium-driver, driven by selenium with the driver's path given: nothing is downloaded).

A node with two simulated GPUs (one with load set by `mtgpu-admin simulate-load`), a
tenant joined with the real `remotegpu-cli` from a 'laptop' folder, its running job, its
job queued with the scheduler's reason, its workspace queued behind them, and another
tenant's running job. `remotegpu-cli dashboard --print-url --no-browser` gives the link;
the page's values, read from the DOM, equal the signed API's answers to the same tenant
(polled until equal within a deadline: nothing changes the load meanwhile), and the other
tenant's job is not on it. `mtgpu-admin dashboard` gives an admin's link, whose page shows
every tenant's jobs as the admin's socket API does. A used link is refused with a page that
says so, the JSON without the session cookie answers 401. Screenshots are saved to
$MTGPU_ARTIFACTS (default build/test-artifacts/ in the checkout) and their paths printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from mtgpu.client.remote import RemoteClient
from tests.support.images import busybox_image, podman_missing
from tests.support.laptop import (invite_and_join, joined_behind_directlink, node_serving_its_relay, printed_link,
                                  remotegpu, running_dashboard)
from tests.support.node import REPO_ROOT, free_port, running_node, wait_for
from tests.support.users import can_create_users, stop_node_and_remove_tenants

if can_create_users():
    pytest.skip(can_create_users(), allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is missing: pip install ./clients/python '.[test]'")
CHROMEDRIVER, CHROMIUM = "/usr/bin/chromedriver", "/usr/bin/chromium"
if not (os.path.exists(CHROMEDRIVER) and os.path.exists(CHROMIUM)):
    pytest.skip("headless Chromium is missing: apt-get install chromium chromium-driver (scripts/install.sh --test)",
                allow_module_level=True)

# The accounts these nodes make never meet another test's, nor each other's: the lab's node
# and the DirectLink node run at the same time (module fixture) and each counts from its start.
UID_RANGE = (410000, 414999)
DL_UID_RANGE = (415000, 419999)
GPUS = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 2}]
FINAL = {"completed", "failed", "cancelled", "lost"}
ARTIFACTS = Path(os.environ.get("MTGPU_ARTIFACTS") or Path(REPO_ROOT) / "build" / "test-artifacts")

# One reading of the page: every row's cells, as the API's values the page keeps (data-value)
# and as the text it shows.
READ_PAGE = """
const rows = (selector, key) => {
  const out = {};
  document.querySelectorAll(selector).forEach(tr => {
    const row = {};
    tr.querySelectorAll('[data-field]').forEach(td => {
      row[td.dataset.field] = JSON.parse(td.dataset.value);
      row[td.dataset.field + '_text'] = td.textContent.trim();
    });
    out[tr.getAttribute(key)] = row;
  });
  return out;
};
const who = document.getElementById('whoami');
return {refreshes: Number(document.body.dataset.refreshes), status: document.getElementById('status').textContent,
        name: who.dataset.name || null, admin: who.dataset.admin || null,
        members: rows('#members-table tr[data-member]', 'data-member'),
        gpus: rows('#gpus-table tr[data-gpu]', 'data-gpu'),
        jobs: rows('#queue-table tr[data-job-id]', 'data-job-id'),
        workspaces: rows('#workspaces-table tr[data-workspace]', 'data-job-id'),
        finished: rows('#finished-table tr[data-job-id]', 'data-job-id')};
"""


def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1100",
                "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)  # --no-sandbox: Chromium refuses to run as root with its sandbox
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for CSP violations
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def lab(alice, tmp_path_factory):
    """The node, the tenant's laptop, the jobs (and a workspace where podman is here), the browser."""
    started = time.monotonic()
    name = f"td{os.getpid() % 10000}"
    with workspace_image() as image:
        containers = {"enabled": True, "templates": {"plain": image}} if image else {"enabled": False}
        with running_node(GPUS, CLUSTER_ID="lab-dash", TENANT_UID_RANGE=list(UID_RANGE),
                          SSH_LISTEN=f"127.0.0.1:{free_port()}", CONTAINERS=containers) as node:
            driver = None
            try:
                home = tmp_path_factory.mktemp("laptop")
                invite_and_join(node, name, home)
                entry = json.loads((home / "servers.json").read_text())[0]
                job = home / "sleep.sh"
                job.write_text("#!/bin/sh\n#MTGPU gpus=1 name=train-<b>bold</b>\nsleep 600\n")
                r = remotegpu(home, "submit", str(job), "--json")
                assert r.returncode == 0, r.stderr
                running = json.loads(r.stdout)["job_id"]
                others = node.submit_json(alice, "--gpus", "1", "--name", "alices-job", "--wrap", "sleep 600")["job_id"]
                node.wait_state(running, "running")
                node.wait_state(others, "running")
                big = home / "big.sh"
                big.write_text("#!/bin/sh\n#MTGPU gpus=2 name=needs-both\nsleep 600\n")
                r = remotegpu(home, "submit", str(big), "--json")
                assert r.returncode == 0, r.stderr
                queued = json.loads(r.stdout)["job_id"]
                workspace = None
                if image:
                    with RemoteClient(entry["server"], entry["tenant"], Path(entry["key"])) as c:
                        workspace = c.create_workspace({"template": "plain", "name": "notebook",
                                                        "resources": {"gpus": "2"}})["job_id"]
                r = node.admin("simulate-load", "1", "--used", "20G", "--util", "90", "--state-dir",
                               str(node.state_dir))
                assert r.returncode == 0, r.stderr
                driver = browser()
                print(f"\nlab ready in {time.monotonic() - started:.1f} s")
                yield SimpleNamespace(node=node, home=home, entry=entry, running=running, others=others,
                                      queued=queued, workspace=workspace, driver=driver, alice=alice)
            finally:
                if driver is not None:
                    driver.quit()
                stop_node_and_remove_tenants(node, [name], UID_RANGE)


def workspace_image():
    """A busybox image for the workspace where podman is here, else a stand-in yielding None."""
    if podman_missing():
        return contextlib.nullcontext(None)
    return busybox_image()


def tenant_client(lab) -> RemoteClient:
    e = lab.entry
    return RemoteClient(e["server"], e["tenant"], Path(e["key"]))


def read_page(driver) -> dict:
    return driver.execute_script(READ_PAGE)


def open_link(driver, url: str) -> dict:
    driver.get(url)
    return wait_for("the dashboard to render", lambda: (p := read_page(driver))["refreshes"] >= 1 and p,
                    timeout_s=20, interval_s=0.1)


def api_view(nodes: list[dict], jobs: list[dict], workspaces: list[dict]) -> dict:
    """What the page must show, from the API's answers."""
    return {
        "members": {n["name"]: (n["role"], n["state"], n["running_jobs"]) for n in nodes},
        "gpus": {f"{n['name']}/{g['index']}": (g["model"], g["utilization_pct"], g["vram_used_bytes"],
                                               g["vram_total_bytes"], g["committed_fraction"])
                 for n in nodes for g in n["gpus"]},
        "jobs": {str(j["id"]): (j["tenant"], j["name"], j["state"], j["reason"], j["nodes"])
                 for j in jobs if j["state"] not in FINAL and not (j["spec"] and j["spec"]["workspace"])},
        "workspaces": {str(w["id"]): (w["tenant"], w["workspace"]["name"], w["state"], w["reason"])
                       for w in workspaces},
    }


def page_view(page: dict) -> dict:
    return {
        "members": {k: (m["role"], m["state"], m["running_jobs"]) for k, m in page["members"].items()},
        "gpus": {k: (g["model"], g["utilization_pct"], g["vram_used_bytes"], g["vram_total_bytes"],
                     g["committed_fraction"]) for k, g in page["gpus"].items()},
        "jobs": {k: (j["tenant"], j["name"], j["state"], j["reason"], j["nodes"]) for k, j in page["jobs"].items()},
        "workspaces": {k: (w["tenant"], w["name"], w["state"], w["reason"]) for k, w in page["workspaces"].items()},
    }


def same_as_api(driver, ask) -> tuple[dict, dict]:
    """Poll until one reading of the page equals the API's answers read just around it."""
    seen = {}

    def equal():
        before = ask()
        page = read_page(driver)
        after = ask()
        seen.update(page=page_view(page), api=after)
        return before == after == page_view(page) and (page, after)
    try:
        return wait_for("the page to show what the API says", equal, timeout_s=20, interval_s=0.25)
    except AssertionError as e:
        raise AssertionError(f"{e}\npage: {seen.get('page')}\napi:  {seen.get('api')}") from None


def console_errors(driver) -> list[dict]:
    """What the page's console says went wrong: a script error, a blocked resource, a CSP violation."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE" or "Content Security Policy" in e["message"]]


def screenshot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    assert driver.save_screenshot(str(path))
    print(f"\nscreenshot: {path}")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000, path.stat().st_size
    return path


def test_the_tenants_page_shows_what_the_signed_api_gives_the_tenant_and_nothing_else(lab):
    r = remotegpu(lab.home, "dashboard", "--print-url", "--no-browser")
    assert r.returncode == 0, r.stderr
    url = r.stdout.strip()
    base = f"http://{lab.entry['server']}"
    assert url.startswith(f"{base}/dashboard?token=") and "\n" not in url, r.stdout
    driver = lab.driver
    page = open_link(driver, url)
    assert driver.current_url == f"{base}/dashboard", "the token stays in the address bar"
    assert page["name"] == lab.entry["tenant"] and page["admin"] == "false", page
    [cookie] = driver.get_cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/dashboard", cookie
    assert driver.execute_script("return document.cookie") == ""  # the page's script cannot read it

    with tenant_client(lab) as c:
        page, api = same_as_api(driver, lambda: api_view(c.nodes(), c.jobs(), c.workspaces()))
    gpu = page["gpus"]["node-a/1"]
    assert (gpu["utilization_pct"], gpu["vram_used_bytes"], gpu["vram_total_bytes"]) == (90, 20 * 2**30, 24 * 2**30)
    assert gpu["utilization_pct_text"] == "90%", gpu
    assert (gpu["vram_used_bytes_text"], gpu["vram_total_bytes_text"]) == ("20G", "24G"), gpu
    assert page["gpus"]["node-a/0"]["utilization_pct"] == 0
    jobs = page["jobs"]
    assert set(jobs) == {str(lab.running), str(lab.queued)}, "the page lists exactly the tenant's own jobs"
    assert str(lab.others) not in jobs and lab.alice.name not in json.dumps(read_page(driver))
    assert jobs[str(lab.running)]["state"] == "running" and jobs[str(lab.queued)]["state_text"] == "queued"
    reason = jobs[str(lab.queued)]["reason"]
    assert reason and reason == jobs[str(lab.queued)]["reason_text"], jobs[str(lab.queued)]
    # a name with markup is shown as the text it is, not as markup
    assert jobs[str(lab.running)]["name_text"] == "train-<b>bold</b>"
    assert not driver.find_elements("css selector", "#queue-table b")
    if lab.workspace is not None:
        [ws] = page["workspaces"].values()
        assert ws["name"] == "notebook" and ws["state"] == "queued" and ws["reason"], ws
    member = page["members"]["node-a"]
    assert sorted(member["running_jobs"]) == sorted([lab.running, lab.others])  # the API's own list (/v1/nodes) ...
    assert member["running_jobs_text"] == f"2 running (yours: {lab.running})"  # ... shown without the others' ids
    assert not console_errors(driver)
    screenshot(driver, "dashboard-tenant.png")

    # The link was used: opening it again is refused with a page that says so.
    again = httpx.get(url, timeout=10, follow_redirects=False)
    assert again.status_code == 403 and "already used" in again.text, again.text
    assert "set-cookie" not in again.headers


def test_the_dashboards_json_and_page_need_the_session_cookie(lab):
    base = f"http://{lab.entry['server']}"
    for path in ("/dashboard/api/me", "/dashboard/api/nodes", "/dashboard/api/jobs", "/dashboard/api/workspaces"):
        for cookies in ({}, {"mtgpu_dashboard_x": "y" * 43}):
            r = httpx.get(base + path, cookies=cookies, timeout=10)
            assert r.status_code == 401 and "no dashboard session" in r.json()["error"], (path, r.text)
    r = httpx.get(base + "/dashboard", timeout=10)
    assert r.status_code == 401 and "remotegpu-cli dashboard" in r.text, r.text
    r = httpx.get(base + "/dashboard?token=" + "A" * 43, timeout=10)
    assert r.status_code == 403 and "not valid here" in r.text
    # A link is for whoever asked: an unsigned request for one is refused.
    r = httpx.post(base + "/v1/dashboard/link", timeout=10)
    assert r.status_code == 401, r.text


def test_an_admins_link_shows_every_tenants_jobs_as_the_admin_api_does(lab):
    done = lab.node.submit_json(lab.alice, "--name", "quick", "--wrap", "exit 3")["job_id"]
    lab.node.wait_state(done, "failed")
    r = lab.node.admin("dashboard", "--print-url", "--no-browser")
    assert r.returncode == 0, r.stderr
    url = r.stdout.strip()
    assert url.startswith(f"http://127.0.0.1:{lab.node.port}/dashboard?token="), url
    driver = lab.driver
    page = open_link(driver, url)
    assert page["name"] == "root" and page["admin"] == "true", page

    def ask():
        with lab.node.client() as c:
            return api_view(c.nodes(), c.jobs(all_tenants=True), c.workspaces(all_tenants=True))
    page, api = same_as_api(driver, ask)
    assert {str(lab.running), str(lab.queued), str(lab.others)} <= set(page["jobs"])
    assert page["jobs"][str(lab.others)]["tenant"] == lab.alice.name
    finished = read_page(driver)["finished"]  # read with the first refresh, then every fifth
    assert set(finished) == {str(done)} and finished[str(done)]["exit_code"] == 3, finished
    assert finished[str(done)]["state"] == "failed" and finished[str(done)]["tenant"] == lab.alice.name
    assert driver.find_element("css selector", f'#queue-table tr[data-job-id="{lab.others}"] td[data-field="tenant"]'
                               ).is_displayed(), "an admin sees the tenant column"
    member = page["members"]["node-a"]
    assert member["running_jobs_text"] == ", ".join(map(str, member["running_jobs"])), "an admin sees the job ids"
    assert not console_errors(driver)
    screenshot(driver, "dashboard-admin.png")
    # a tenant on the node is no admin: mtgpu-admin says so and gives no link
    r = lab.node.run_cli("mtgpu.cli.admin", lab.alice, "dashboard", "--print-url", "--no-browser")
    assert r.returncode == 1 and "needs root or the admin group" in r.stderr and not r.stdout, r.stdout + r.stderr
    # the tenant's own command gives a sentence with the link when not asked for the link alone
    r = remotegpu(lab.home, "dashboard", "--no-browser")
    assert r.returncode == 0 and "one-time link" in r.stdout and "/dashboard?token=" in r.stdout, r.stdout + r.stderr


def test_through_directlink_the_link_is_a_local_forward_kept_until_ctrl_c(tmp_path):
    """A server that does not answer directly (its address in servers.json is dead): the
    command reaches the node through DirectLink (the member serves the relay itself, on
    loopback), and the link it prints is a forward on 127.0.0.1 that it keeps open."""
    name = f"tl{os.getpid() % 10000}"
    home = tmp_path / "laptop"
    with node_serving_its_relay("node-dl", "lab-dash-dl", DL_UID_RANGE) as node:
        proc = None
        try:
            joined_behind_directlink(node, name, home)
            proc = running_dashboard(home)
            url = printed_link(proc)
            assert url.startswith("http://127.0.0.1:") and "/dashboard?token=" in url, url
            assert not url.startswith(f"http://127.0.0.1:{node.port}/"), "the link is the forward, not LISTEN"
            with httpx.Client(timeout=20, follow_redirects=True) as browser_like:
                r = browser_like.get(url)
                assert r.status_code == 200 and 'id="queue-table"' in r.text, r.text[:500]
                assert str(r.url).endswith("/dashboard")
                me = browser_like.get(str(r.url) + "/api/me").json()
                assert me["name"] == name and me["admin"] is False and me["node"] == "node-dl", me
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            assert "through DirectLink to node-dl" in err and "Ctrl-C ends it" in err, err
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            stop_node_and_remove_tenants(node, [name], DL_UID_RANGE)
