// The core against a real mtgpu-server (test/real_node.py): the servers.json that
// `remotegpu-cli join` wrote, signed requests and the node's real answers, the views'
// rows from a real snapshot, and ssh to the node through remotegpu-cli ssh-config.

import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import * as http from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  ApiClient, ApiError, ClusterWatcher, configDir, hostAlias, jobRows, loadPrivateKey, publicLineOf, readServers,
  RemoteGpuCli, serverRows, serversPath, signHeaders, sshFolderUri, TUNNEL_TIMEOUT_MS, uriString, workspaceRows,
} from "../out/core.mjs";
import { CLI, realNodeMissing, run, startRealNode, waitFor } from "./support.mjs";

const missing = realNodeMissing();

/** A request sent as it is given (for what ApiClient never sends: replays, a body it did not sign). */
function raw(server, method, path, body, headers) {
  const [host, port] = server.split(":");
  return new Promise((ok, fail) => {
    const req = http.request({ host, port: Number(port), method, path, headers: { "content-type": "application/json",
      "content-length": String(body.length), ...headers } }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => ok({ status: res.statusCode, body: JSON.parse(Buffer.concat(chunks).toString() || "null") }));
    });
    req.on("error", fail);
    req.end(body);
  });
}

function otherKey() {
  const { privateKey, publicKey } = generateKeyPairSync("ed25519");
  const pub = publicKey.export({ format: "der", type: "spki" }).subarray(-32);
  return { privateKey, publicLine: publicLineOf(pub), source: "a key made by the test" };
}

describe("against a real mtgpu-server", { skip: missing ?? false }, () => {
  let node;
  let entry;
  let client;
  let dir;
  const submitted = [];

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "remote-gpu-node-"));
    node = await startRealNode();
    const file = await readServers(node.servers_json);
    assert.equal(file.problem, null);
    entry = file.entries[0];
    client = new ApiClient({ server: entry.server, tenant: entry.tenant, key: await loadPrivateKey(entry.key) });
  });

  after(async () => {
    rmSync(dir, { recursive: true, force: true });
    if (!node) {
      return;
    }
    const r = await node.stop();
    assert.equal(r.code, 0, `real_node.py ended with ${r.code} ${r.signal ?? ""}: ${r.stderr}`);
    const id = await run("id", ["-u", node.tenant]);
    assert.notEqual(id.code, 0, `the tenant account ${node.tenant} is still there after the node stopped`);
  });

  it("reads the servers.json that remotegpu-cli join wrote, where remotegpu-cli keeps it", async () => {
    assert.equal(serversPath(configDir({ REMOTEGPU_HOME: node.home })), node.servers_json);
    assert.equal(entry.server, node.server);
    assert.equal(entry.tenant, node.tenant);
    assert.equal(entry.cluster_id, node.cluster_id);
    assert.equal(entry.node, node.node);
    assert.equal(entry.key, join(node.home, "id_ed25519"));
    assert.ok(entry.uid >= 390000 && entry.uid <= 399999, `uid ${entry.uid} from the node's TENANT_UID_RANGE`);
  });

  it("is the tenant it joined as (GET /v1/me, signed), and reads /v1/info unsigned", async () => {
    const me = await client.me();
    assert.equal(me.name, node.tenant);
    assert.equal(me.uid, entry.uid);
    assert.equal(me.cluster_id, node.cluster_id);
    assert.deepEqual(me.clusters, [node.cluster_id]);
    const info = await new ApiClient({ server: entry.server }).info();
    assert.equal(info.node, node.node);
    assert.equal(info.cluster_mode, "cluster");
  });

  it("submits a job, follows its log to the end and sees it completed", async () => {
    const r = await client.submit("#!/bin/bash\n#MTGPU name=from-vscode\necho hello-from-vscode $MTGPU_JOB_ID\n" +
      "echo \"h\u00e9llo \u2713\"\n");
    assert.deepEqual(r.job_ids, [r.job_id]);
    submitted.push(r.job_id);
    const chunks = [];
    const last = await client.followLog(r.job_id, { pollMs: 100, onData: (b) => chunks.push(b) });
    assert.equal(Buffer.concat(chunks).toString("utf8"), `hello-from-vscode ${r.job_id}\nh\u00e9llo \u2713\n`);
    assert.equal(last.final, true);
    const job = await client.job(r.job_id);
    assert.equal(job.state, "completed");
    assert.equal(job.exit_code, 0);
    assert.equal(job.name, "from-vscode");
    assert.deepEqual(job.nodes, [node.node]);
    const listed = await client.jobs();
    assert.ok(listed.some((j) => j.id === r.job_id && j.tenant === node.tenant));
    const tail = await client.logSlice(r.job_id, 0, 1);
    assert.equal(tail.data.toString("utf8"), "h\u00e9llo \u2713\n");
  });

  it("follows a running job until stopped, cancels it, and the node refuses a second cancel", async () => {
    const r = await client.submit("#!/bin/bash\necho started\nsleep 120\n");
    submitted.push(r.job_id);
    await waitFor(`job ${r.job_id} running`, async () => (await client.job(r.job_id)).state === "running", 30000);
    // Following a running job goes on until it is stopped (the log terminal's Ctrl-C).
    const stop = new AbortController();
    let seen = "";
    const following = client.followLog(r.job_id, { pollMs: 100, signal: stop.signal, onData: (b) => { seen += b; } });
    await waitFor("the running job's first line", () => seen === "started\n", 20000);
    stop.abort();
    assert.equal(await following, null);
    assert.deepEqual((await client.cancel(r.job_id)).cancelled, [r.job_id]);
    await waitFor(`job ${r.job_id} cancelled`, async () => (await client.job(r.job_id)).state === "cancelled", 30000);
    await assert.rejects(client.cancel(r.job_id), (e) => e instanceof ApiError && e.status === 409 &&
      /already cancelled/.test(e.message));
    const active = await client.jobs(true);
    assert.ok(!active.some((j) => j.id === r.job_id), "a cancelled job is not listed as active");
  });

  it("lists workspaces, and gets the node's own answers to create, stop and a bad name", async () => {
    assert.deepEqual(await client.workspaces(), []);
    // This node has no containers: the node refuses, with its reason, and nothing is created.
    await assert.rejects(client.createWorkspace({ image: "localhost/nothing:1", resources: { gpus: "1" } }),
      (e) => e instanceof ApiError && e.kind === "answer" && e.status >= 400 && e.status < 500 && /refused/.test(e.message));
    await assert.rejects(client.createWorkspace({ template: "a", image: "b" }),
      (e) => e instanceof ApiError && e.status === 422 && /give one of --template NAME, --image IMAGE/.test(e.message));
    await assert.rejects(client.workspaceAction("nope", "stop"),
      (e) => e instanceof ApiError && e.status === 404 && /no workspace 'nope' of yours/.test(e.message));
    assert.throws(() => ApiClient.workspaceName("../jobs"), (e) => e instanceof ApiError && e.kind === "usage");
    assert.deepEqual(await client.workspaces(), []);
  });

  it("is refused with 401 when the request is signed with another key, or is not what was signed, or replayed", async () => {
    const stranger = new ApiClient({ server: entry.server, tenant: entry.tenant, key: otherKey() });
    await assert.rejects(stranger.jobs(), (e) => e instanceof ApiError && e.status === 401 &&
      /wrong signature/.test(e.message));
    const nobody = new ApiClient({ server: entry.server, tenant: "nobody-here", key: otherKey() });
    await assert.rejects(nobody.me(), (e) => e instanceof ApiError && e.status === 401 && /unknown tenant/.test(e.message));
    await assert.rejects(new ApiClient({ server: entry.server }).jobs(), (e) => e instanceof ApiError && e.kind === "usage");

    const key = await loadPrivateKey(entry.key);
    const ts = (Date.now() / 1000).toFixed(3);
    const signedBody = Buffer.from(JSON.stringify({ script: "#!/bin/bash\ntrue\n", overrides: {} }));
    const otherBody = Buffer.from(JSON.stringify({ script: "#!/bin/bash\nrm -rf ~\n", overrides: {} }));
    const h = signHeaders(key, entry.tenant, "POST", "/v1/jobs", signedBody, ts);
    const tampered = await raw(entry.server, "POST", "/v1/jobs", otherBody, h);
    assert.equal(tampered.status, 401);
    assert.match(tampered.body.error, /wrong signature/);

    const g = signHeaders(key, entry.tenant, "GET", "/v1/workspaces", Buffer.alloc(0), (Date.now() / 1000).toFixed(3));
    assert.equal((await raw(entry.server, "GET", "/v1/workspaces", Buffer.alloc(0), g)).status, 200);
    const again = await raw(entry.server, "GET", "/v1/workspaces", Buffer.alloc(0), g);
    assert.equal(again.status, 401);
    assert.match(again.body.error, /replay/);
  });

  it("sends many identical requests at once, each with its own signature", async () => {
    const answers = await Promise.all(Array.from({ length: 8 }, () => client.workspaces()));
    assert.equal(answers.length, 8);
  });

  it("shows the members' live use (the tenant GET /v1/nodes)", async () => {
    const nodes = await client.nodes();
    const me = nodes.find((n) => n.name === node.node);
    assert.ok(me, JSON.stringify(nodes));
    assert.deepEqual(me.gpus.map((g) => g.model), ["rtx4090", "rtx4090"]);
  });

  it("renders the views from a real snapshot", async () => {
    const snap = await new ClusterWatcher({ serversFile: node.servers_json }).snapshot();
    assert.equal(snap.servers.length, 1);
    const s = snap.servers[0];
    assert.equal(s.error, null);
    assert.ok(s.nodes && s.nodes.length === 1, s.nodesProblem);
    assert.equal(s.via, undefined);  // it answers directly: no tunnel

    const [server] = serverRows(snap);
    assert.equal(server.label, `${node.cluster_id} (${node.server})`);
    assert.equal(server.contextValue, "server");
    const member = server.children.find((r) => r.contextValue === "node");
    assert.deepEqual(member.ref, { kind: "node", server: node.server, node: node.node, cluster: node.cluster_id });
    assert.ok(server.children.some((r) => r.label === "your jobs: none active"), JSON.stringify(server.children));

    const jobs = jobRows(snap);
    const [done, cancelled] = submitted.map((id) => jobs.find((r) => r.ref?.id === id));
    assert.equal(done.label, `${submitted[0]} from-vscode`);
    assert.equal(done.contextValue, "job-final");
    assert.match(done.description, /^completed · node-a · exit 0/);
    assert.match(cancelled.description, /^cancelled/);

    const ws = workspaceRows(snap);
    assert.equal(ws.length, 1);
    assert.equal(ws[0].contextValue, "message");
    assert.match(ws[0].label, /^no workspaces/);
  });

  it("gets the node's Host from remotegpu-cli ssh-config, and ssh to it reaches the tenant through DirectLink", async () => {
    const sshConfig = join(dir, "ssh_config");
    const cli = new RemoteGpuCli({ cliPath: CLI, home: node.home, sshConfigFile: sshConfig, timeoutMs: 60000 });
    const host = hostAlias(node.node, node.cluster_id);
    const known = join(node.home, "known_hosts.directlink");
    // The node's sshd host key reaches the cluster's state shortly after it starts.
    const r = await waitFor("ssh-config with the node's host key", async () => {
      const got = await cli.sshConfig();
      return existsSync(known) && readFileSync(known, "utf8").startsWith(`${host} ssh-ed25519 `) && got;
    }, 30000, 500);
    assert.equal(r.file, sshConfig);
    assert.deepEqual(r.hosts, [host]);
    assert.match(readFileSync(sshConfig, "utf8"), new RegExp(`Host ${host.replace(".", "\\.")}\\n`));

    const a = cli.sshArgv(host, { command: ["id", "-un"], batch: true });
    const ssh = await run(a.command, a.args);
    assert.equal(ssh.code, 0, ssh.stderr);
    assert.equal(ssh.stdout.trim(), node.tenant);

    const home = await cli.remoteHome(host);
    const passwd = (await run("getent", ["passwd", node.tenant])).stdout.trim().split(":");
    assert.equal(home, passwd[5]);
    assert.equal(uriString(sshFolderUri(host, home)), `vscode-remote://ssh-remote+${host}${home}`);
  });

  it("lists the clusters the tenant may use with remotegpu-cli clusters (what Refresh runs first)", async () => {
    const cli = new RemoteGpuCli({ cliPath: CLI, home: node.home, timeoutMs: 60000 });
    const rows = await cli.clusters();
    assert.deepEqual(rows, [{ cluster_id: node.cluster_id, server: node.server, state: "ok" }]);
    const entries = JSON.parse(readFileSync(node.servers_json, "utf8"));
    assert.deepEqual(entries.map((e) => e.cluster_id), [node.cluster_id]);
  });

  it("asks a server that does not answer directly through remotegpu-cli tunnel (DirectLink)", async () => {
    // The same join, but its LISTEN address does not answer: only the relay reaches the node.
    const home = mkdtempSync(join(dir, "behind-nat-"));
    const copy = JSON.parse(readFileSync(node.servers_json, "utf8")).map((e) => ({ ...e, server: "127.0.0.1:9" }));
    writeFileSync(join(home, "servers.json"), JSON.stringify(copy));
    const cli = new RemoteGpuCli({ cliPath: CLI, home });
    const watcher = new ClusterWatcher({ serversFile: join(home, "servers.json"), openTunnel: (s) => cli.tunnel(s) });
    try {
      const snap = await watcher.snapshot();
      const s = snap.servers[0];
      assert.equal(s.error, null);
      assert.ok(["direct", "relayed"].includes(s.via), s.via);
      assert.ok(submitted.every((id) => s.jobs.some((j) => j.id === id)), JSON.stringify(s.jobs));
      const [row] = serverRows(snap);
      assert.match(row.description, /through DirectLink \((direct|relayed)\)/);
      // The commands' client goes the same way.
      const c = await watcher.client(copy[0]);
      assert.equal((await c.me()).name, node.tenant);
      // ... and waits for its answers as long as the relay's hops may take, not the direct 5 s.
      assert.equal(c.opts.timeoutMs, TUNNEL_TIMEOUT_MS);
    } finally {
      watcher.close();
    }
  });

  it("says which servers ssh-config skipped (no DirectLink), for the refusal the commands show", async () => {
    // A join of a server that does not answer now and had no DirectLink (a standalone node).
    const home = mkdtempSync(join(dir, "standalone-"));
    const copy = JSON.parse(readFileSync(node.servers_json, "utf8")).map((e) => ({ ...e, server: "127.0.0.1:9",
      directlink: { enabled: false, cluster_id: e.cluster_id, relays: [], nodes: [] } }));
    writeFileSync(join(home, "servers.json"), JSON.stringify(copy));
    const cli = new RemoteGpuCli({ cliPath: CLI, home, sshConfigFile: join(home, "ssh_config") });
    const r = await cli.sshConfig();
    assert.deepEqual(r.hosts, []);
    assert.ok(r.notes.some((n) => /127\.0\.0\.1:9 .*has no DirectLink relay: skipped/.test(n)), JSON.stringify(r.notes));
  });
});
