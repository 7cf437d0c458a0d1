// `vsce package` builds a .vsix whose manifest holds the views and every command the
// extension registers; the core imports nothing from vscode.

import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { EXT_DIR, run } from "./support.mjs";
import { readZip } from "./zip.mjs";

const VIEWS = ["remoteGpu.servers", "remoteGpu.workspaces", "remoteGpu.jobs"];

/** The command ids src/views/commands.ts registers (`add("remoteGpu.x", ...)`). */
function registeredCommands() {
  const src = readFileSync(join(EXT_DIR, "src", "views", "commands.ts"), "utf8");
  return [...src.matchAll(/add\("(remoteGpu\.[A-Za-z]+)"/g)].map((m) => m[1]).sort();
}

describe("the .vsix", () => {
  let dir;
  let files;
  let manifest;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "remote-gpu-vsix-"));
    const out = join(dir, "remote-gpu.vsix");
    const vsce = join(EXT_DIR, "node_modules", ".bin", "vsce");
    const r = await run(vsce, ["package", "--no-dependencies", "--skip-license", "--allow-missing-repository",
                               "--out", out], { cwd: EXT_DIR, timeout: 120000 });
    assert.equal(r.code, 0, `vsce package failed:\n${r.stdout}\n${r.stderr}`);
    assert.doesNotMatch(r.stdout + r.stderr, /WARNING/, "vsce warned");
    files = readZip(readFileSync(out));
    manifest = JSON.parse(files.get("extension/package.json").toString("utf8"));
  });

  after(() => rmSync(dir, { recursive: true, force: true }));

  it("holds the bundled extension and nothing of node_modules or the sources", () => {
    const names = [...files.keys()].sort();
    assert.ok(names.includes("extension.vsixmanifest"));
    assert.ok(names.includes("extension/out/extension.js"));
    assert.equal(manifest.main, "./out/extension.js");
    assert.deepEqual(names.filter((n) => /node_modules|\/src\/|\/test\//.test(n)), []);
    const bundle = files.get("extension/out/extension.js").toString("utf8");
    assert.match(bundle, /require\("vscode"\)/, "vscode stays external (VS Code provides it)");
    assert.match(readFileSync(join(EXT_DIR, "package.json"), "utf8"), /"name": "remote-gpu"/);
  });

  it("lists the views in their own activity bar container", () => {
    const c = manifest.contributes;
    assert.deepEqual(c.viewsContainers.activitybar.map((v) => v.id), ["remoteGpu"]);
    assert.ok(files.has(`extension/${c.viewsContainers.activitybar[0].icon}`), "the container's icon is packaged");
    assert.deepEqual(c.views.remoteGpu.map((v) => v.id), VIEWS);
    assert.deepEqual(c.views.remoteGpu.map((v) => v.name), ["Servers", "Workspaces", "Jobs"]);
    for (const v of VIEWS) {
      assert.ok(manifest.activationEvents.includes(`onView:${v}`), v);
    }
    assert.deepEqual(manifest.extensionKind, ["ui"], "it runs beside remotegpu-cli and ssh, on this computer");
  });

  it("declares exactly the commands the extension registers, and its menus name only those", () => {
    const declared = manifest.contributes.commands.map((c) => c.command).sort();
    assert.deepEqual(declared, registeredCommands());
    for (const id of ["remoteGpu.openTerminal", "remoteGpu.openFolder", "remoteGpu.attachContainer",
                      "remoteGpu.createWorkspace", "remoteGpu.stopWorkspace", "remoteGpu.removeWorkspace",
                      "remoteGpu.cancelJob", "remoteGpu.followLogs"]) {
      assert.ok(declared.includes(id), id);
    }
    const menus = Object.values(manifest.contributes.menus).flat();
    for (const m of menus) {
      assert.ok(declared.includes(m.command), `menu entry for an undeclared command ${m.command}`);
    }
    // The item commands are in the context menus of the rows the core gives them to.
    const item = manifest.contributes.menus["view/item/context"];
    const on = (cmd) => item.filter((m) => m.command === cmd).map((m) => m.when).join(" | ");
    assert.match(on("remoteGpu.openTerminal"), /viewItem == node/);
    assert.match(on("remoteGpu.openTerminal"), /viewItem == workspace-running/);
    assert.match(on("remoteGpu.attachContainer"), /viewItem == workspace-running/);
    assert.match(on("remoteGpu.cancelJob"), /viewItem == job-active/);
    assert.match(on("remoteGpu.removeWorkspace"), /viewItem =~ \/\^workspace-\//);
  });

  it("offers only settings the extension reads", () => {
    const props = Object.keys(manifest.contributes.configuration.properties).sort();
    const src = readFileSync(join(EXT_DIR, "src", "views", "session.ts"), "utf8");
    assert.deepEqual(props, ["remoteGpu.cliPath", "remoteGpu.home"]);
    for (const p of props) {
      assert.match(src, new RegExp(`get<string>\\("${p.split(".")[1]}"`), p);
    }
  });
});

describe("the core", () => {
  it("imports nothing from vscode, and its bundle only node's own modules", () => {
    const core = join(EXT_DIR, "src", "core");
    for (const f of readdirSync(core)) {
      const text = readFileSync(join(core, f), "utf8");
      assert.doesNotMatch(text, /from\s+["']vscode["']|require\(["']vscode["']\)/, f);
    }
    const bundle = readFileSync(join(EXT_DIR, "out", "core.mjs"), "utf8");
    const imported = [...bundle.matchAll(/^import .* from "([^"]+)";$/gm)].map((m) => m[1]);
    assert.ok(imported.length > 0);
    assert.deepEqual(imported.filter((m) => !m.startsWith("node:")), []);
  });
});
