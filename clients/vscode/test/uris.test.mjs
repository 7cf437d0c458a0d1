// The names and URIs the SSH commands open, and the programs they run.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { attachedContainerUri, hostAlias, RemoteGpuCli, sshFolderUri, sshRemoteAuthority, uriString } from "../out/core.mjs";

describe("URIs", () => {
  it("names a node's Host as remotegpu-cli ssh-config does (NODE.CLUSTER)", () => {
    assert.equal(hostAlias("gpu-1", "lab"), "gpu-1.lab");
  });

  it("opens a Remote-SSH folder as vscode-remote://ssh-remote+HOST/path", () => {
    assert.equal(uriString(sshFolderUri("gpu-1.lab", "/home/mtgpu/alice")), "vscode-remote://ssh-remote+gpu-1.lab/home/mtgpu/alice");
    assert.equal(uriString(sshFolderUri("gpu-1.lab", "/data/my project")), "vscode-remote://ssh-remote+gpu-1.lab/data/my%20project");
    // A host that is not a plain name goes as Remote-SSH's hex JSON.
    const a = sshRemoteAuthority("alice@gpu 1");
    assert.equal(JSON.parse(Buffer.from(a.slice("ssh-remote+".length), "hex").toString()).hostName, "alice@gpu 1");
    assert.throws(() => sshFolderUri("gpu-1.lab", "relative/path"), /not an absolute path/);
  });

  it("attaches to a workspace's container on its node as Dev Containers nests it", () => {
    const u = attachedContainerUri("mtgpu-ws12", "gpu-1.lab", "/home/mtgpu/alice");
    const [attached, ssh] = u.authority.split("@");
    assert.equal(ssh, "ssh-remote+gpu-1.lab");
    assert.deepEqual(JSON.parse(Buffer.from(attached.slice("attached-container+".length), "hex").toString()),
      { containerName: "/mtgpu-ws12" });
    assert.equal(uriString(u), "vscode-remote://attached-container+7b22636f6e7461696e65724e616d65223a222f6d746770752d77733132227d" +
      "@ssh-remote+gpu-1.lab/home/mtgpu/alice");
    assert.throws(() => attachedContainerUri("x; rm -rf /", "gpu-1.lab", "/"), /not a container name/);
  });
});

describe("the programs the commands run", () => {
  const cli = new RemoteGpuCli({ cliPath: "/usr/local/bin/remotegpu-cli", home: "/h/rg", sshConfigFile: "/h/ssh_config" });

  it("passes remotegpu-cli the same folder the extension reads (--home)", () => {
    assert.deepEqual(cli.shellArgv("lab", "10.0.0.5:7070"),
      { command: "/usr/local/bin/remotegpu-cli", args: ["--home", "/h/rg", "shell", "--server", "10.0.0.5:7070", "lab"] });
    assert.deepEqual(cli.forwardArgv("lab", 8888, "10.0.0.5:7070").args,
      ["--home", "/h/rg", "forward", "lab", "8888", "--server", "10.0.0.5:7070"]);
    assert.deepEqual(new RemoteGpuCli({ cliPath: "remotegpu-cli" }).argv("ssh-config", "--json").args, ["ssh-config", "--json"]);
  });

  it("runs ssh HOST with Remote-SSH's config file", () => {
    assert.deepEqual(cli.sshArgv("gpu-1.lab"), { command: "ssh", args: ["-F", "/h/ssh_config", "gpu-1.lab"] });
    assert.deepEqual(new RemoteGpuCli({ cliPath: "x", sshPath: "/opt/ssh" }).sshArgv("gpu-1.lab", { workspace: "lab" }),
      { command: "/opt/ssh", args: ["-o", "SetEnv=MTGPU_WORKSPACE=lab", "-t", "gpu-1.lab"] });
  });

  it("says clearly when remotegpu-cli is not installed", async () => {
    await assert.rejects(new RemoteGpuCli({ cliPath: "/nonexistent/remotegpu-cli" }).sshConfig(),
      /\/nonexistent\/remotegpu-cli was not found: install mtgpu's client/);
  });
});
