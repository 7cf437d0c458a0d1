// The signature and the config folder agree with the Python side byte for byte.

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  configDir, KeyError, loadPrivateKey, parseOpenSshPrivateKey, RequestClock, serversPath, signedMessage, signHeaders,
} from "../out/core.mjs";
import { python, run } from "./support.mjs";

const SIGN_WITH_PYTHON = `
import json, sys, types
from pathlib import Path
import mtgpu.client.signing as s
case = json.loads(sys.stdin.read())
key = s.load_private_key(Path(case["key"]))
s.time = types.SimpleNamespace(time=lambda: case["now"])  # sign_headers reads the clock here
h = s.sign_headers(key, case["tenant"], case["method"], case["path"], bytes.fromhex(case["body"]))
msg = s._message(case["method"], case["path"], h["x-mtgpu-time"], bytes.fromhex(case["body"]))
print(json.dumps({"headers": h, "message": msg.hex(), "public": s.public_line(key)}))
`;

const FIXED_KEY = `
import sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
open(sys.argv[1], "wb").write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                               serialization.NoEncryption()))
`;

let dir;
before(() => { dir = mkdtempSync(join(tmpdir(), "remote-gpu-sign-")); });
after(() => rmSync(dir, { recursive: true, force: true }));

async function pythonSigns(keyPath, c) {
  return JSON.parse(await python(SIGN_WITH_PYTHON, [], JSON.stringify({ key: keyPath, ...c })));
}

describe("the signature", () => {
  const cases = [
    { tenant: "alice", method: "post", path: "/v1/jobs", now: 1700000000.123,
      body: Buffer.from('{"script": "#!/bin/bash\\necho h\\u00e9llo \u2713", "overrides": {}}', "utf8") },
    { tenant: "bob-2", method: "GET", path: "/v1/jobs/7/log/stream?offset=10&rank=0&tail=5", now: 1712345678.5,
      body: Buffer.alloc(0) },
  ];

  it("equals the Python client's for a fixed key, time and body", async () => {
    const keyPath = join(dir, "fixed_ed25519");
    await python(FIXED_KEY, [keyPath]);
    const key = await loadPrivateKey(keyPath);
    for (const c of cases) {
      const py = await pythonSigns(keyPath, { tenant: c.tenant, method: c.method, path: c.path, now: c.now,
                                              body: c.body.toString("hex") });
      const ts = py.headers["x-mtgpu-time"];
      assert.equal(ts, (c.now).toFixed(3));
      assert.equal(signedMessage(c.method, c.path, ts, c.body).toString("hex"), py.message);
      assert.deepEqual(signHeaders(key, c.tenant, c.method, c.path, c.body, ts), py.headers);
    }
    assert.equal(key.publicLine, (await pythonSigns(keyPath, { ...cases[1], body: "" })).public);
  });

  it("equals Python's for a key made by ssh-keygen (with a comment)", async (t) => {
    const keyPath = join(dir, "keygen_ed25519");
    const r = await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", "someone@laptop", "-f", keyPath]);
    if (r.code !== 0) {
      t.skip(`ssh-keygen is not usable here: ${r.stderr}`);
      return;
    }
    const key = await loadPrivateKey(keyPath);
    assert.equal(key.publicLine, readFileSync(`${keyPath}.pub`, "utf8").split(" ").slice(0, 2).join(" "));
    const c = cases[0];
    const py = await pythonSigns(keyPath, { ...c, body: c.body.toString("hex") });
    assert.deepEqual(signHeaders(key, c.tenant, c.method, c.path, c.body, py.headers["x-mtgpu-time"]), py.headers);
  });

  it("refuses keys it cannot use, saying why", async (t) => {
    assert.throws(() => parseOpenSshPrivateKey("not a key", "k1"), (e) => e instanceof KeyError && /k1 is not an OpenSSH/.test(e.message));
    const rsa = join(dir, "rsa");
    const enc = join(dir, "enc_ed25519");
    const r1 = await run("ssh-keygen", ["-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", rsa]);
    const r2 = await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "a passphrase", "-f", enc]);
    if (r1.code !== 0 || r2.code !== 0) {
      t.skip("ssh-keygen is not usable here");
      return;
    }
    await assert.rejects(loadPrivateKey(rsa), /is a ssh-rsa key, not ed25519/);
    await assert.rejects(loadPrivateKey(enc), /is encrypted with a passphrase/);
    await assert.rejects(loadPrivateKey(join(dir, "missing")), /cannot read the private key/);
  });

  it("gets a new time for every request, also within one millisecond", () => {
    const clock = new RequestClock(() => 1700000000123.4);
    assert.deepEqual([clock.next(), clock.next(), clock.next()], ["1700000000.123", "1700000000.124", "1700000000.125"]);
  });
});

describe("remotegpu-cli's folder", () => {
  // The same folder as mtgpu/cli/remotegpu.py config_dir(): the real function for
  // POSIX (Linux, macOS); for Windows its logic with ntpath, as Python runs it there.
  const PY_CONFIG_DIR = `
import json, ntpath, os, sys
from mtgpu.cli.remotegpu import config_dir
out = []
for c in json.loads(sys.stdin.read()):
    os.environ.clear()
    os.environ.update(c["env"])
    if c["platform"] == "win32":
        out.append(os.environ.get("REMOTEGPU_HOME") or ntpath.join(ntpath.expanduser("~"), ".config", "remotegpu"))
    else:
        out.append(str(config_dir()))
    out[-1] = [out[-1], str(config_dir() / "servers.json") if c["platform"] != "win32" else ntpath.join(out[-1], "servers.json")]
print(json.dumps(out))
`;
  const cases = [
    { platform: "linux", env: { HOME: "/home/bob" } },
    { platform: "linux", env: { HOME: "/home/bob/" } },
    { platform: "darwin", env: { HOME: "/Users/carol" } },
    { platform: "linux", env: { HOME: "/" } },
    { platform: "linux", env: { HOME: "/h", REMOTEGPU_HOME: "/srv/rg" } },
    { platform: "linux", env: { HOME: "/h", REMOTEGPU_HOME: "" } },
    { platform: "win32", env: { USERPROFILE: "C:\\Users\\bob" } },
    { platform: "win32", env: { USERPROFILE: "C:\\Users\\bob\\" } },
    { platform: "win32", env: { HOMEDRIVE: "D:", HOMEPATH: "\\Users\\eve" } },
    { platform: "win32", env: { HOMEPATH: "\\Users\\eve" } },
    { platform: "win32", env: { USERPROFILE: "C:\\Users\\bob", REMOTEGPU_HOME: "E:\\rg" } },
  ];

  it("is the one the Python side uses, on Linux, macOS and Windows", async () => {
    const py = JSON.parse(await python(PY_CONFIG_DIR, [], JSON.stringify(cases)));
    cases.forEach((c, i) => {
      const home = configDir(c.env, c.platform);
      assert.equal(home, py[i][0], JSON.stringify(c));
      assert.equal(serversPath(home, c.platform), py[i][1], JSON.stringify(c));
    });
  });
});
