/**
 * Tenant request signatures, as mtgpu/client/signing.py makes them: ed25519 over
 * "mtgpu-tenant-v1", the method, the path with its query, a timestamp and the SHA-256
 * of the body, one per line. The node refuses a request more than 60 s away from its
 * clock and a signature it has already seen, so every request gets a time of its own.
 *
 * Keys are the OpenSSH ed25519 keys `remotegpu-cli join` writes (the same pair serves
 * ssh). Node's crypto signs ed25519 but cannot read the OpenSSH container, so it is
 * read here (unencrypted keys only, as the Python side).
 */

import { createHash, createPrivateKey, createPublicKey, sign, KeyObject } from "node:crypto";
import { readFile } from "node:fs/promises";

export const HEADER_TENANT = "x-mtgpu-tenant";
export const HEADER_TIME = "x-mtgpu-time";
export const HEADER_SIGNATURE = "x-mtgpu-signature";

/** A key that cannot be used; the message says which and why. */
export class KeyError extends Error {}

export interface TenantKey {
  privateKey: KeyObject;
  /** `ssh-ed25519 AAAA...` (no comment), as the node stores it. */
  publicLine: string;
  /** Where it was read from, for messages. */
  source: string;
}

const MAGIC = Buffer.from("openssh-key-v1\0", "latin1");
// PKCS#8 wrapping of a raw ed25519 seed (RFC 8410): what createPrivateKey reads.
const PKCS8_ED25519_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");

class Reader {
  private at = 0;
  constructor(private readonly buf: Buffer, private readonly where: string) {}

  u32(): number {
    if (this.at + 4 > this.buf.length) {
      throw new KeyError(`${this.where} is not a valid OpenSSH private key (it ends too early)`);
    }
    const v = this.buf.readUInt32BE(this.at);
    this.at += 4;
    return v;
  }

  bytes(): Buffer {
    const n = this.u32();
    if (this.at + n > this.buf.length) {
      throw new KeyError(`${this.where} is not a valid OpenSSH private key (a field runs past its end)`);
    }
    const v = this.buf.subarray(this.at, this.at + n);
    this.at += n;
    return v;
  }

  text(): string {
    return this.bytes().toString("utf8");
  }
}

function sshString(b: Buffer): Buffer {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(b.length);
  return Buffer.concat([len, b]);
}

/** The `ssh-ed25519 AAAA...` line of a raw 32-byte public key. */
export function publicLineOf(raw: Buffer): string {
  const blob = Buffer.concat([sshString(Buffer.from("ssh-ed25519")), sshString(raw)]);
  return `ssh-ed25519 ${blob.toString("base64")}`;
}

/** Reads the text of an OpenSSH private key file (`-----BEGIN OPENSSH PRIVATE KEY-----`). */
export function parseOpenSshPrivateKey(text: string, where = "the key"): TenantKey {
  const m = /-----BEGIN OPENSSH PRIVATE KEY-----([\s\S]*?)-----END OPENSSH PRIVATE KEY-----/.exec(text);
  if (!m) {
    throw new KeyError(`${where} is not an OpenSSH private key (no BEGIN OPENSSH PRIVATE KEY block); ` +
      "give the key `remotegpu-cli join` made, or one from `ssh-keygen -t ed25519`");
  }
  const raw = Buffer.from(m[1].replace(/\s+/g, ""), "base64");
  if (raw.length < MAGIC.length || !raw.subarray(0, MAGIC.length).equals(MAGIC)) {
    throw new KeyError(`${where} is not an OpenSSH private key (wrong magic)`);
  }
  const r = new Reader(raw.subarray(MAGIC.length), where);
  const cipher = r.text();
  const kdf = r.text();
  r.bytes(); // kdf options
  if (cipher !== "none" || kdf !== "none") {
    throw new KeyError(`${where} is encrypted with a passphrase (${cipher}); the extension, like remotegpu-cli, ` +
      "needs an unencrypted key: use the one `remotegpu-cli join` made");
  }
  const count = r.u32();
  if (count !== 1) {
    throw new KeyError(`${where} holds ${count} keys; one is expected`);
  }
  r.bytes(); // the public key blob, repeated in the private part
  const priv = new Reader(r.bytes(), where);
  if (priv.u32() !== priv.u32()) {
    throw new KeyError(`${where} is damaged (its check numbers differ)`);
  }
  const type = priv.text();
  if (type !== "ssh-ed25519") {
    throw new KeyError(`${where} is a ${type} key, not ed25519; create one with \`ssh-keygen -t ed25519\``);
  }
  const pub = priv.bytes();
  const secret = priv.bytes(); // seed (32) followed by the public key (32)
  if (pub.length !== 32 || secret.length !== 64 || !secret.subarray(32).equals(pub)) {
    throw new KeyError(`${where} is not a valid ed25519 key (wrong key lengths)`);
  }
  const privateKey = createPrivateKey({
    key: Buffer.concat([PKCS8_ED25519_PREFIX, secret.subarray(0, 32)]),
    format: "der",
    type: "pkcs8",
  });
  // The seed must give the public key the file states, else the file is not what it claims.
  const derived = createPublicKey(privateKey).export({ format: "der", type: "spki" }).subarray(-32);
  if (!derived.equals(pub)) {
    throw new KeyError(`${where} is damaged (its public key does not belong to its private key)`);
  }
  return { privateKey, publicLine: publicLineOf(pub), source: where };
}

export async function loadPrivateKey(path: string): Promise<TenantKey> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    throw new KeyError(`cannot read the private key ${path}: ${(e as Error).message}`);
  }
  return parseOpenSshPrivateKey(text, path);
}

/** The bytes that are signed (mtgpu/client/signing.py `_message`). */
export function signedMessage(method: string, path: string, ts: string, body: Buffer | string): Buffer {
  const digest = createHash("sha256").update(body).digest("hex");
  return Buffer.from(["mtgpu-tenant-v1", method.toUpperCase(), path, ts, digest].join("\n"), "utf8");
}

/** Seconds since the epoch with three decimals, as the Python client writes them. */
export function formatTime(epochMs: number): string {
  return (epochMs / 1000).toFixed(3);
}

export function signHeaders(key: TenantKey, tenant: string, method: string, path: string,
                            body: Buffer | string, ts: string): Record<string, string> {
  const signature = sign(null, signedMessage(method, path, ts, body), key.privateKey);
  return { [HEADER_TENANT]: tenant, [HEADER_TIME]: ts, [HEADER_SIGNATURE]: signature.toString("base64") };
}

/**
 * Times for signed requests that never repeat: two requests with the same method, path
 * and body in the same millisecond would otherwise carry the same signature, and the
 * node refuses the second as a replay. Each time is at least 1 ms after the last one.
 */
export class RequestClock {
  private lastMs = 0;
  constructor(private readonly now: () => number = Date.now) {}

  next(): string {
    const ms = Math.max(Math.floor(this.now()), this.lastMs + 1);
    this.lastMs = ms;
    return formatTime(ms);
  }
}
