"""Errors of cluster membership, kept apart so the API can name them without loading Raft."""


class ClusterSetupError(Exception):
    """This member cannot take part in the cluster (or cannot do what was asked); the
    message says why and what to do."""


class LogUnavailable(Exception):
    """The member that holds a job's log could not be asked for it; the message says why."""
