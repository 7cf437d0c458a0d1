"""Workspaces: long-running interactive containers (mt-container)."""
