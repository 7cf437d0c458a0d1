"""Runners start, watch and stop jobs on this node (native via a root shim; podman)."""
