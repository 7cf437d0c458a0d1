"""Local Features installed in the order the specification gives, for real (issue 24): the
fixture feature-order (installsAfter by path, a dependsOn on a Feature also given, a dependsOn
on one not given, with options of its own) built into a workspace's image by `mt-container
create`; each install.sh appended its name and $GREETING to /feature-order in the build, read
back in the container. The expected lines are what @devcontainers/cli 0.89.0 built from the
same folder (the fixture's comment). Before, the dependsOn was refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.integration.test_workspaces import image, mtc, mtc_json, running, wnode  # noqa: F401 (fixtures)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "devcontainer"


def test_local_features_install_in_the_specifications_order(wnode, alice, image):
    project = Path(alice.home) / "order"
    shutil.copytree(FIXTURES / "feature-order", project)
    config = project / ".devcontainer" / "devcontainer.json"
    config.write_text(config.read_text().replace("localhost/base:1", image))
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(project)], check=True)
    r = mtc(wnode, alice, "create", "--devcontainer", str(project), "--name", "order", "--json", timeout_s=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    running(wnode, alice, "order")
    r = mtc(wnode, alice, "exec", "order", "--", "cat", "/feature-order")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert [line.strip() for line in r.stdout.splitlines()] == ["delta asked-by-zeta", "gamma", "beta", "zeta",
                                                                "alpha"], r.stdout
    assert mtc(wnode, alice, "rm", "order").returncode == 0
