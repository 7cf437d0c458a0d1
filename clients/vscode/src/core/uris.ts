/**
 * Names and URIs for the SSH side: the Host names `remotegpu-cli ssh-config` writes
 * (mtgpu/client/sshconfig.py `host_alias`), the Remote-SSH folder URI, and the Dev
 * Containers URI of a container on such a host.
 *
 * A URI is given as its parts (scheme, authority, path) so that the extension builds it
 * with vscode.Uri.from and nothing is escaped twice; `uriString` writes it out.
 */

export interface RemoteUri {
  scheme: "vscode-remote";
  authority: string;
  path: string;
}

/** NODE.CLUSTER: the Host of a node in the ssh config `remotegpu-cli ssh-config` writes. */
export function hostAlias(node: string, cluster: string): string {
  return `${node}.${cluster}`;
}

export function hex(text: string): string {
  return Buffer.from(text, "utf8").toString("hex");
}

/** Remote-SSH's authority: the host as it is when it is a plain name, else hex JSON as Remote-SSH writes it. */
export function sshRemoteAuthority(host: string): string {
  if (!host) {
    throw new Error("an SSH host name is needed");
  }
  return /^[A-Za-z0-9][A-Za-z0-9.-]*$/.test(host) ? `ssh-remote+${host}` : `ssh-remote+${hex(JSON.stringify({ hostName: host }))}`;
}

function absolutePath(p: string): string {
  if (!p.startsWith("/")) {
    throw new Error(`${JSON.stringify(p)} is not an absolute path on the remote host`);
  }
  return p;
}

/** A folder on a Remote-SSH host: vscode-remote://ssh-remote+HOST/path. */
export function sshFolderUri(host: string, folder: string): RemoteUri {
  return { scheme: "vscode-remote", authority: sshRemoteAuthority(host), path: absolutePath(folder) };
}

/**
 * A folder in a running container on a Remote-SSH host, as Dev Containers opens it:
 * vscode-remote://attached-container+HEX({"containerName":"/NAME"})@ssh-remote+HOST/path.
 * The Dev Containers extension runs its container commands on HOST (with its
 * `dev.containers.dockerPath`, which must be `mt-podman` there: the tenant's rootless
 * Podman holds the workspace's container).
 */
export function attachedContainerUri(container: string, host: string, folder: string): RemoteUri {
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(container)) {
    throw new Error(`${JSON.stringify(container)} is not a container name`);
  }
  const attached = `attached-container+${hex(JSON.stringify({ containerName: `/${container}` }))}`;
  return { scheme: "vscode-remote", authority: `${attached}@${sshRemoteAuthority(host)}`, path: absolutePath(folder) };
}

/** The URI as text, as `code --folder-uri` takes it. */
export function uriString(u: RemoteUri): string {
  const path = u.path.split("/").map((s) => encodeURIComponent(s)).join("/");
  return `${u.scheme}://${u.authority}${path}`;
}
