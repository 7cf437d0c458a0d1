"""What the API's two sides (server/api and client) agree on besides paths and bodies."""

STALE_HEADER = "x-mtgpu-stale"  # set by a member that cannot reach the cluster: why its answer may be old
