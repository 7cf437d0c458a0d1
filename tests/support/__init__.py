"""Helpers shared by tests: real OS facilities (temporary Linux users, ...)."""
