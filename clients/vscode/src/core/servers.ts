/**
 * The servers the tenant joined, read from the file remotegpu-cli keeps
 * (mtgpu/cli/remotegpu.py `config_dir()` / servers.json): the extension never writes it,
 * `remotegpu-cli join` does.
 *
 * The folder is $REMOTEGPU_HOME when set and not empty, else ~/.config/remotegpu on every
 * system (Windows and macOS too), with `~` expanded as Python's os.path.expanduser does.
 */

import * as os from "node:os";
import { readFile } from "node:fs/promises";

export interface DirectLinkNode {
  name: string;
  id: string;
  ssh_host_key?: string;
}

export interface ServerEntry {
  /** HOST:PORT of the node joined (its LISTEN). */
  server: string;
  tenant: string;
  /** The private key's absolute path. */
  key: string;
  cluster_id: string;
  node: string;
  uid: number;
  directlink?: { enabled: boolean; cluster_id: string; relays: string[]; nodes: DirectLinkNode[] } | null;
}

export interface ServersFile {
  path: string;
  entries: ServerEntry[];
  /** Why the file (or an entry of it) could not be used; null when all is well. */
  problem: string | null;
}

type Env = Record<string, string | undefined>;

/** Python's os.path.join for our relative parts: a separator only where one is missing (no normalizing). */
function pyJoin(platform: NodeJS.Platform, first: string, ...parts: string[]): string {
  const win = platform === "win32";
  let out = first;
  for (const p of parts) {
    const bare = out === "" || (win ? /[\\/]$/.test(out) || /^[A-Za-z]:$/.test(out) : out.endsWith("/"));
    out = bare ? out + p : out + (win ? "\\" : "/") + p;
  }
  return out;
}

/** Python's os.path.expanduser("~") on this platform (posixpath or ntpath, 3.11). */
export function pythonHome(env: Env, platform: NodeJS.Platform = process.platform): string {
  if (platform === "win32") {
    if (env.USERPROFILE !== undefined) {
      return env.USERPROFILE;
    }
    if (env.HOMEPATH !== undefined) {
      return pyJoin(platform, env.HOMEDRIVE ?? "", env.HOMEPATH);
    }
    // Python would leave "~" as it is (a folder named "~" in the working directory);
    // the profile folder is what was meant.
    return os.homedir();
  }
  const home = env.HOME !== undefined ? env.HOME : os.userInfo().homedir;
  return home.replace(/\/+$/, "") || "/";
}

/** remotegpu-cli's folder: servers.json, the key, known_hosts (the same string Python makes). */
export function configDir(env: Env = process.env, platform: NodeJS.Platform = process.platform): string {
  if (env.REMOTEGPU_HOME) {
    return env.REMOTEGPU_HOME;
  }
  return pyJoin(platform, pythonHome(env, platform), ".config", "remotegpu");
}

export function serversPath(home: string, platform: NodeJS.Platform = process.platform): string {
  return pyJoin(platform, home, "servers.json");
}

function checkEntry(e: unknown, i: number): { entry?: ServerEntry; problem?: string } {
  if (!e || typeof e !== "object") {
    return { problem: `entry ${i + 1} is not an object` };
  }
  const o = e as Record<string, unknown>;
  for (const k of ["server", "tenant", "key"]) {
    if (typeof o[k] !== "string" || !o[k]) {
      return { problem: `entry ${i + 1} has no ${k}` };
    }
  }
  return {
    entry: {
      server: o.server as string,
      tenant: o.tenant as string,
      key: o.key as string,
      cluster_id: typeof o.cluster_id === "string" ? o.cluster_id : "",
      node: typeof o.node === "string" ? o.node : "",
      uid: typeof o.uid === "number" ? o.uid : -1,
      directlink: (o.directlink ?? null) as ServerEntry["directlink"],
    },
  };
}

/** The joined servers; a missing file is no servers (join first), a broken one says why. */
export async function readServers(file: string): Promise<ServersFile> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    return {
      path: file, entries: [],
      problem: code === "ENOENT" ? `no server joined yet (${file} does not exist): ` +
        "run `remotegpu-cli join CODE --server HOST:PORT`" : `cannot read ${file}: ${(e as Error).message}`,
    };
  }
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (e) {
    return { path: file, entries: [], problem: `${file} is not valid JSON (${(e as Error).message}); ` +
      "remotegpu-cli would see no servers either: join again" };
  }
  if (!Array.isArray(data)) {
    return { path: file, entries: [], problem: `${file} is not a list of servers` };
  }
  const entries: ServerEntry[] = [];
  const problems: string[] = [];
  data.forEach((e, i) => {
    const r = checkEntry(e, i);
    if (r.entry) {
      entries.push(r.entry);
    } else {
      problems.push(r.problem as string);
    }
  });
  if (!entries.length && !problems.length) {
    problems.push(`no server joined yet (${file} is empty): run \`remotegpu-cli join CODE --server HOST:PORT\``);
  }
  return { path: file, entries, problem: problems.length ? `${file}: ${problems.join("; ")}` : null };
}

/** The entry for `name` as remotegpu-cli's `--server` finds it (server, node or cluster id). */
export function findServer(entries: ServerEntry[], name: string): ServerEntry | undefined {
  return entries.find((s) => [s.server, s.node, s.cluster_id].includes(name));
}
