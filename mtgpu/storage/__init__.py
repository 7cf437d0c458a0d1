"""Tenant storage: read-only publishing (shared.py), disk usage and quotas (quota.py),
and what retention removes (retention.py, pure)."""
