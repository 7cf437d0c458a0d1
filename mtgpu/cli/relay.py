"""mtgpu-relay: a self-hosted DirectLink relay (docs/DIRECTLINK.md). No GPU, no cluster
state: it is told which clusters it serves by their DirectLink keys
(`mtgpu-admin directlink cluster-key` prints a cluster's)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from ..directlink.identity import CredentialError, public_key_of
from ..directlink.relay import Relay


def parse_clusters(values: list[str]) -> dict:
    trusted = {}
    for v in values:
        cid, sep, key = v.partition("=")
        if not sep or not cid:
            raise CredentialError(f"--cluster {v!r}: give ID=KEY, the cluster's CLUSTER_ID and the key "
                                  "`mtgpu-admin directlink cluster-key` prints on one of its members")
        trusted[cid] = public_key_of(key.strip())
    return trusted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mtgpu-relay", description=__doc__)
    ap.add_argument("--listen", required=True, help="HOST:PORT (TCP for endpoints, UDP for address asks)")
    ap.add_argument("--cluster", action="append", default=[], metavar="ID=KEY",
                    help="a cluster this relay serves (repeat for several)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit():
        print(f"mtgpu-relay: --listen {args.listen!r}: give HOST:PORT, e.g. 0.0.0.0:7443", file=sys.stderr)
        return 2
    try:
        trusted = parse_clusters(args.cluster)
    except CredentialError as e:
        print(f"mtgpu-relay: {e}", file=sys.stderr)
        return 2
    if not trusted:
        print("mtgpu-relay: no --cluster given: a relay serves the clusters it is told of, never anyone "
              "(give --cluster ID=KEY)", file=sys.stderr)
        return 2

    async def run() -> None:
        relay = Relay(trusted)
        try:
            server, _udp = await relay.serve(host, int(port))
        except OSError as e:
            print(f"mtgpu-relay: cannot listen on {args.listen}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        logging.getLogger("mtgpu-relay").info("relaying on %s for %s", args.listen, ", ".join(sorted(trusted)))
        async with server:
            await server.serve_forever()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
