"""mtgpu-server: run this node in the foreground (the service manager keeps it running)."""

from __future__ import annotations

import argparse
import logging
import sys

from ..config import ConfigError, load_config
from ..server.cluster.errors import ClusterSetupError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtgpu-server", description=__doc__)
    parser.add_argument("--config", help="the TOML config (default: $MTGPU_CONFIG, else /etc/mtgpu/mtgpu.toml)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"mtgpu-server: the config cannot be used:\n{e}", file=sys.stderr)
        return 2
    hold_member_early(config)
    from ..agent.podman.tenant import PodmanSetupError
    from ..server.main import run_node  # heavy imports only after the config is good
    from ..server.ports import PortTaken
    from ..state.journal import JournalCorrupt

    # Order matters: PortTaken is a ClusterSetupError, and says more.
    refusals = ((JournalCorrupt, "cannot start"), (PortTaken, "cannot start"),
                (ClusterSetupError, "this member cannot take part in the cluster"),
                (PodmanSetupError, "containers cannot run on this node"))
    try:
        return run_node(config)
    except tuple(kind for kind, _ in refusals) as e:
        what = next(words for kind, words in refusals if isinstance(e, kind))
        # said once: the log goes to stderr too (logging.basicConfig), so no log line beside it
        print(f"mtgpu-server: {what}: {e}", file=sys.stderr)
        return 2


def hold_member_early(config) -> None:
    """This process into its services group, weighted above its jobs, before the imports
    and the state's reload (runners/cgroups.py): its jobs ran on while it was away, and
    a restart at their share of the CPU came back seconds later. What fails here is said
    (and done again) where the agent starts."""
    from pathlib import Path

    from ..agent.runners.cgroups import CgroupManager, parent_for

    try:
        CgroupManager.hold_member_early(parent_for(config.NODE_NAME, Path(config.STATE_DIR)))
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
