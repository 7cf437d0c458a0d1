"""Rootless Podman for tenants: settings, CDI, staged images."""
