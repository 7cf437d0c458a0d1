"""Tenant accounts: plan.py decides (pure, replayable), apply.py touches the OS."""
