// What the tests share: the repository's paths, mtgpu's Python, a real node.

import { execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const EXT_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO_ROOT = resolve(EXT_DIR, "..", "..");
/** mtgpu's Python: $MTGPU_PYTHON, else the installed environment, else python3 on PATH. */
export const PYTHON = process.env.MTGPU_PYTHON ||
  (existsSync("/opt/mtgpu/venv/bin/python") ? "/opt/mtgpu/venv/bin/python" : "python3");
export const CLI = process.env.REMOTEGPU_CLI ||
  (existsSync(join(dirname(PYTHON), "remotegpu-cli")) ? join(dirname(PYTHON), "remotegpu-cli") : "remotegpu-cli");
export const PY_ENV = { ...process.env, PYTHONPATH: REPO_ROOT };

/** Runs mtgpu's Python with `code`; resolves with stdout. */
export function python(code, args = [], input) {
  return new Promise((ok, fail) => {
    const child = execFile(PYTHON, ["-c", code, ...args], { env: PY_ENV, timeout: 60000, maxBuffer: 8 << 20 },
      (err, stdout, stderr) => (err ? fail(new Error(`python failed: ${stderr || err.message}`)) : ok(stdout)));
    if (input !== undefined) {
      child.stdin.end(input);
    }
  });
}

export function run(command, args, opts = {}) {
  return new Promise((ok) => {
    execFile(command, args, { timeout: 90000, maxBuffer: 8 << 20, ...opts }, (err, stdout, stderr) =>
      ok({ code: err ? (typeof err.code === "number" ? err.code : -1) : 0, stdout: String(stdout), stderr: String(stderr) }));
  });
}

/** Why the real-node tests cannot run here, or null. */
export function realNodeMissing() {
  if (process.getuid?.() !== 0) {
    return "the real node makes Linux accounts for its tenant: run as root";
  }
  if (!existsSync(PYTHON) && PYTHON !== "python3") {
    return `no mtgpu Python at ${PYTHON} (set MTGPU_PYTHON)`;
  }
  return null;
}

/**
 * Starts test/real_node.py: a real mtgpu-server with a joined tenant. Resolves with what
 * it printed and a stop() that ends it (stdin closed) and waits for its teardown.
 */
export function startRealNode(timeoutMs = 90000) {
  const child = spawn(PYTHON, [join(EXT_DIR, "test", "real_node.py")], { env: PY_ENV, stdio: ["pipe", "pipe", "pipe"] });
  let out = "";
  let err = "";
  const exited = new Promise((ok) => child.on("exit", (code, signal) => ok({ code, signal })));
  const stop = async () => {
    child.stdin.end();
    const timer = setTimeout(() => child.kill("SIGTERM"), 30000);
    const r = await exited;
    clearTimeout(timer);
    return { ...r, stderr: err };
  };
  return new Promise((ok, fail) => {
    const timer = setTimeout(() => {
      child.kill("SIGTERM");
      fail(new Error(`the real node did not come up in ${timeoutMs / 1000} s: ${err}`));
    }, timeoutMs);
    child.stderr.on("data", (d) => { err += d; });
    child.stdout.on("data", (d) => {
      out += d;
      const line = out.split("\n").find((l) => l.startsWith("{"));
      if (line) {
        clearTimeout(timer);
        ok({ ...JSON.parse(line), stop, stderr: () => err });
      }
    });
    exited.then(({ code }) => {
      clearTimeout(timer);
      fail(new Error(`real_node.py exited (${code}) before the node was up: ${err}`));
    });
  });
}

/** Polls `check` until it returns something truthy; fails saying what it waited for. */
export async function waitFor(what, check, timeoutMs = 30000, intervalMs = 100) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    try {
      const v = await check();
      if (v) {
        return v;
      }
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}` + (last ? ` (last error: ${last.message})` : ""));
}
