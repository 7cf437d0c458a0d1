/**
 * The commands. Each one either does what it says or refuses with a message that says
 * why and what to do; none pretends. SSH and DirectLink go through remotegpu-cli
 * (ssh-config, shell, forward); API calls through the core client.
 */

import * as path from "node:path";

import * as vscode from "vscode";

import {
  ApiClient, attachedContainerUri, hostAlias, Ref, RemoteGpuCli, RemoteUri, Row, ServerEntry, sshFolderUri,
  uriString,
} from "../core";
import { followLogTerminal } from "./logTerminal";
import { cli, Session } from "./session";

const REMOTE_SSH = "ms-vscode-remote.remote-ssh";
const DEV_CONTAINERS = "ms-vscode-remote.remote-containers";

/** A refusal: shown as a warning, with its message as written. */
class Refusal extends Error {}

type RefOf<K extends Ref["kind"]> = Extract<Ref, { kind: K }>;

function refOf<K extends Ref["kind"]>(row: Row | undefined, ...kinds: K[]): RefOf<K> {
  const ref = row?.ref;
  if (!ref || !(kinds as string[]).includes(ref.kind)) {
    throw new Refusal(`pick a ${kinds.join(" or ")} in the Remote GPU views for this command`);
  }
  return ref as RefOf<K>;
}

function run(name: string, f: (row?: Row) => Promise<unknown>): (row?: Row) => Promise<void> {
  return async (row?: Row) => {
    try {
      await f(row);
    } catch (e) {
      const msg = (e as Error).message || String(e);
      if (e instanceof Refusal) {
        void vscode.window.showWarningMessage(`Remote GPU: ${msg}`);
      } else {
        void vscode.window.showErrorMessage(`Remote GPU ${name}: ${msg}`);
      }
    }
  };
}

function progress<T>(title: string, f: () => Promise<T>): Thenable<T> {
  return vscode.window.withProgress({ location: vscode.ProgressLocation.Notification, title }, f);
}

function toUri(u: RemoteUri): vscode.Uri {
  return vscode.Uri.from({ scheme: u.scheme, authority: u.authority, path: u.path });
}

/**
 * `remotegpu-cli ssh-config` first (it refreshes the DirectLink credential and the pinned
 * host keys), then the node's Host must be among those it wrote.
 */
async function sshHost(c: RemoteGpuCli, node: string, cluster: string): Promise<string> {
  const host = hostAlias(node, cluster);
  const r = await progress(`remotegpu-cli ssh-config (for ${host})`, () => c.sshConfig());
  if (!r.hosts.includes(host)) {
    const said = r.notes.length ? ` It said: ${r.notes.join("; ")}.` : "";
    throw new Refusal(`remotegpu-cli ssh-config wrote no Host ${host} into ${r.file}.${said} SSH terminals and ` +
      "Remote-SSH from VS Code go through the cluster's DirectLink ([DIRECTLINK] relays on its members); " +
      "without it, reach the node with `ssh -i KEY -p SSH_PORT TENANT@NODE` by hand, or use a workspace's terminal " +
      "(remotegpu-cli shell).");
  }
  return host;
}

function needExtension(id: string, what: string): void {
  if (!vscode.extensions.getExtension(id)) {
    throw new Refusal(`${what} needs the extension ${id}; install it and try again`);
  }
}

function runningWorkspace(ref: RefOf<"workspace">): RefOf<"workspace"> & { node: string } {
  if (ref.state !== "running" || !ref.node) {
    throw new Refusal(`workspace ${ref.name} is ${ref.state}; start it first (its context menu: Start Workspace)`);
  }
  return ref as RefOf<"workspace"> & { node: string };
}

async function pickServer(session: Session, row?: Row): Promise<ServerEntry> {
  if (row?.ref) {
    return session.entry(row.ref.server);
  }
  let entries: ServerEntry[];
  try {
    entries = await session.entries();
  } catch (e) {
    throw new Refusal((e as Error).message);
  }
  if (entries.length === 1) {
    return entries[0];
  }
  const picked = await vscode.window.showQuickPick(entries.map((e) => ({ label: e.server,
    description: `${e.tenant} @ ${e.cluster_id}`, entry: e })), { placeHolder: "Which server?" });
  if (!picked) {
    throw new Refusal("no server picked: nothing done");
  }
  return picked.entry;
}

async function remoteFolder(c: RemoteGpuCli, host: string, what: string): Promise<string | undefined> {
  const home = await progress(`asking ${host} for your home folder`, () => c.remoteHome(host));
  return vscode.window.showInputBox({
    title: what, value: home, prompt: `A folder on ${host} (absolute path)`,
    validateInput: (v) => (v.startsWith("/") ? undefined : "an absolute path on the node, starting with /"),
  });
}

export function registerCommands(context: vscode.ExtensionContext, session: Session): void {
  const add = (id: string, f: (row?: Row) => Promise<unknown>) =>
    context.subscriptions.push(vscode.commands.registerCommand(id, run(id.replace(/^remoteGpu\./, ""), f)));

  add("remoteGpu.refresh", async () => {
    // The clusters the tenant may use, as they say now (an admin may have given or taken one):
    // servers.json is brought up to date first, then the views read it.
    try {
      const changed = (await cli().clusters()).filter((r) => r.state === "added" || r.state.startsWith("removed"));
      if (changed.length) {
        void vscode.window.showInformationMessage(
          `Remote GPU: ${changed.map((r) => `${r.cluster_id} ${r.state}`).join("; ")}`);
      }
    } catch (e) {
      void vscode.window.showWarningMessage(`Remote GPU: the clusters could not all be asked: ${(e as Error).message}`);
    }
    await session.refresh();
  });

  add("remoteGpu.writeSshConfig", async () => {
    const r = await progress("remotegpu-cli ssh-config", () => cli().sshConfig());
    const hosts = r.hosts.length ? `Hosts: ${r.hosts.join(", ")} (ssh HOST)` : "no hosts";
    void vscode.window.showInformationMessage(`${r.file}: ${hosts}.` + (r.notes.length ? ` ${r.notes.join("; ")}` : ""));
  });

  add("remoteGpu.openTerminal", async (row) => {
    const ref = refOf(row, "node", "workspace");
    const c = cli();
    if (ref.kind === "workspace") {
      const ws = runningWorkspace(ref);
      const a = c.shellArgv(ws.name, ws.server);
      vscode.window.createTerminal({ name: `workspace ${ws.name}`, shellPath: a.command, shellArgs: a.args }).show();
      return;
    }
    const host = await sshHost(c, ref.node, ref.cluster);
    const a = c.sshArgv(host);
    vscode.window.createTerminal({ name: `ssh ${host}`, shellPath: a.command, shellArgs: a.args }).show();
  });

  add("remoteGpu.openFolder", async (row) => {
    const ref = refOf(row, "node", "workspace");
    needExtension(REMOTE_SSH, "Opening a folder over Remote-SSH");
    const node = ref.kind === "node" ? ref.node : runningWorkspace(ref).node;
    const c = cli();
    const host = await sshHost(c, node, ref.cluster);
    const folder = await remoteFolder(c, host, `Open a folder on ${host} over Remote-SSH`);
    if (!folder) {
      return;
    }
    await vscode.commands.executeCommand("vscode.openFolder", toUri(sshFolderUri(host, folder)), { forceNewWindow: true });
  });

  add("remoteGpu.attachContainer", async (row) => {
    const ws = runningWorkspace(refOf(row, "workspace"));
    if (!ws.container) {
      throw new Refusal(`workspace ${ws.name} has no container yet; wait until its node has made it`);
    }
    needExtension(REMOTE_SSH, "Attaching to a workspace's container");
    needExtension(DEV_CONTAINERS, "Attaching to a workspace's container");
    const dockerPath = vscode.workspace.getConfiguration("dev.containers").get<string>("dockerPath", "docker");
    if (path.posix.basename(dockerPath) !== "mt-podman") {
      const go = await vscode.window.showWarningMessage(
        `Dev Containers runs ${JSON.stringify(dockerPath)} on ${ws.node} to find the container, but workspace ` +
        `${ws.name}'s container is in your rootless Podman there, which only mt-podman reaches. Set ` +
        "dev.containers.dockerPath to mt-podman (user settings, or the Remote [SSH] settings of the node) first.",
        { modal: true }, "Attach Anyway", "Open Settings");
      if (go === "Open Settings") {
        await vscode.commands.executeCommand("workbench.action.openSettings", "dev.containers.dockerPath");
        return;
      }
      if (go !== "Attach Anyway") {
        return;
      }
    }
    const c = cli();
    const host = await sshHost(c, ws.node, ws.cluster);
    // The home is mounted at its own path inside the workspace.
    const folder = await remoteFolder(c, host, `Open a folder in workspace ${ws.name}`);
    if (!folder) {
      return;
    }
    const uri = attachedContainerUri(ws.container, host, folder);
    await vscode.commands.executeCommand("vscode.openFolder", toUri(uri), { forceNewWindow: true });
    void vscode.window.showInformationMessage(`Opening ${uriString(uri)}`);
  });

  add("remoteGpu.forwardPort", async (row) => {
    const ws = runningWorkspace(refOf(row, "workspace"));
    if (!ws.ports.length) {
      throw new Refusal(`workspace ${ws.name} publishes no port; create it with a port (or a template that has one)`);
    }
    let port = ws.ports[0];
    if (ws.ports.length > 1) {
      const picked = await vscode.window.showQuickPick(ws.ports.map(String), { placeHolder: "Which port?" });
      if (!picked) {
        return;
      }
      port = Number(picked);
    }
    const a = cli().forwardArgv(ws.name, port, ws.server);
    vscode.window.createTerminal({ name: `forward ${ws.name}:${port}`, shellPath: a.command, shellArgs: a.args }).show();
    void vscode.window.showInformationMessage(`http://localhost:${port} reaches workspace ${ws.name} port ${port} ` +
      `while the terminal "forward ${ws.name}:${port}" is open`);
  });

  add("remoteGpu.createWorkspace", async (row) => {
    const entry = await pickServer(session, row);
    const source = await vscode.window.showQuickPick([
      { label: "From a template", description: "a template of the node's [CONTAINERS] templates", kind_: "template" },
      { label: "From an image", description: "an image the cluster offers", kind_: "image" },
    ], { placeHolder: `A workspace on ${entry.server}` });
    if (!source) {
      return;
    }
    const what = await vscode.window.showInputBox({ title: source.label,
      prompt: source.kind_ === "template" ? "Template name (the server names its templates when it refuses one)"
        : "Image, e.g. localhost/pytorch:2.6",
      validateInput: (v) => (v.trim() ? undefined : "required") });
    if (!what) {
      return;
    }
    const name = await vscode.window.showInputBox({ title: "Workspace name (empty: the server picks one)",
      validateInput: (v) => (!v || /^[a-z0-9][a-z0-9_.-]{0,39}$/.test(v) ? undefined
        : "1-40 lower-case letters, digits, '.', '_' and '-', starting with a letter or digit") });
    if (name === undefined) {
      return;
    }
    const gpus = await vscode.window.showInputBox({ title: "GPUs (empty: none), as the gpus= directive: 1, nvidia:1, rtx4090:1, 0.5" });
    if (gpus === undefined) {
      return;
    }
    const portsText = await vscode.window.showInputBox({ title: "Container ports to publish (empty: the template's), e.g. 8888,6006",
      validateInput: (v) => (!v.trim() || /^\s*\d+(\s*,\s*\d+)*\s*$/.test(v) ? undefined : "port numbers, comma-separated") });
    if (portsText === undefined) {
      return;
    }
    const client = await session.client(entry.server);
    const r = await progress(`creating a workspace on ${entry.server}`, () => client.createWorkspace({
      template: source.kind_ === "template" ? what.trim() : undefined,
      image: source.kind_ === "image" ? what.trim() : undefined,
      name: name || undefined, resources: gpus.trim() ? { gpus: gpus.trim() } : {},
      ports: portsText.trim() ? portsText.split(",").map((p) => Number(p.trim())) : [],
    }));
    await session.refresh();
    void vscode.window.showInformationMessage(`workspace ${r.name} (job ${r.job_id}) created` +
      (r.warning ? `: ${r.warning}` : ""));
  });

  const workspaceAction = (action: "start" | "stop" | "rm", verb: string) => async (row?: Row) => {
    const ref = refOf(row, "workspace");
    if (action === "rm") {
      const ok = await vscode.window.showWarningMessage(`Remove workspace ${ref.name}? Its container and what you ` +
        "installed in it are gone (your home stays).", { modal: true }, "Remove");
      if (ok !== "Remove") {
        return;
      }
    }
    const client = await session.client(ref.server);
    await client.workspaceAction(ref.name, action);
    await session.refresh();
    void vscode.window.showInformationMessage(`workspace ${ref.name} ${verb}`);
  };
  add("remoteGpu.startWorkspace", workspaceAction("start", "queued to start"));
  add("remoteGpu.stopWorkspace", workspaceAction("stop", "stopped (its container is kept)"));
  add("remoteGpu.removeWorkspace", workspaceAction("rm", "removed"));

  add("remoteGpu.submitJob", async (row) => {
    const doc = vscode.window.activeTextEditor?.document;
    if (!doc || !doc.getText().trim()) {
      throw new Refusal("open the job file (a script with #MTGPU directives) in the editor first");
    }
    const entry = await pickServer(session, row);
    const client = await session.client(entry.server);
    const r = await client.submit(doc.getText());
    await session.refresh();
    const go = await vscode.window.showInformationMessage(`submitted ${path.basename(doc.fileName)} as job ` +
      `${r.job_ids.join(", ")} on ${entry.server}` + (r.warning ? `: ${r.warning}` : ""), "Follow Logs");
    if (go) {
      followLogTerminal(client, r.job_id, `job ${r.job_id} log`).show();
    }
  });

  add("remoteGpu.cancelJob", async (row) => {
    const ref = refOf(row, "job");
    const ok = await vscode.window.showWarningMessage(`Cancel job ${ref.id} (${ref.name})?`, { modal: true }, "Cancel Job");
    if (ok !== "Cancel Job") {
      return;
    }
    const client: ApiClient = await session.client(ref.server);
    const r = await client.cancel(ref.id);
    await session.refresh();
    void vscode.window.showInformationMessage(`cancelled ${r.cancelled.join(", ")}`);
  });

  add("remoteGpu.followLogs", async (row) => {
    const ref = refOf(row, "job");
    const client = await session.client(ref.server);
    followLogTerminal(client, ref.id, `job ${ref.id} log`).show();
  });
}
