#!/usr/bin/env bash
# Install mtgpu on this Debian machine: the distribution packages it uses, then the
# Python package into /opt/mtgpu/venv (outside /root, so tenants can run the CLIs).
#   bash scripts/install.sh            the node
#   bash scripts/install.sh --test     the node plus the test tools
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MTGPU_VENV:-/opt/mtgpu/venv}
# podman, uidmap, slirp4netns, catatonit, runc: rootless container jobs ([CONTAINERS]);
# iptables: the rule that keeps each workspace port its tenant's.
PACKAGES=(python3 python3-venv python3-dev gcc passwd util-linux procps openssh-server openssh-client tmux iproute2
          podman uidmap slirp4netns catatonit runc iptables)
EXTRA=""
if [ "${1:-}" = "--test" ]; then
  EXTRA="[test]"
  # test images are built offline from busybox; the image pre-stage test pulls from docker-registry;
  # prometheus: promtool and the server that tests/integration/test_metrics.py starts itself (the
  # package's own service is not started: the policy-rc.d below refuses it)
  PACKAGES+=(busybox-static docker-registry prometheus)
fi
if [ "$(id -u)" != 0 ]; then
  echo "scripts/install.sh: run as root (it installs packages and creates $VENV)" >&2
  exit 2
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing distribution packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Installing openssh-server must not start the machine's own sshd: mtgpu runs its own
  # tenant sshd on SSH_LISTEN and leaves the admin's alone.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [ $own_policy = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q ".$EXTRA"
# the devcontainer.json reference for tests/integration/test_devcontainer_reference.py (Node >= 20;
# Debian 12's own nodejs is 18: then that test says it is skipped and why)
if [ -n "$EXTRA" ] && command -v npm >/dev/null && node -e 'process.exit(parseInt(process.versions.node) >= 20 ? 0 : 1)'; then
  npm ci --prefix tests/tools/devcontainer-cli --no-audit --no-fund --loglevel=error
fi
chmod -R a+rX "$(dirname "$VENV")"
for cmd in mtgpu-server mtgpu-admin mt-job mtgpu-setup mt-python mt-podman mt-container remotegpu-cli; do
  ln -sf "$VENV/bin/$cmd" "/usr/local/bin/$cmd"
done
echo "mtgpu installed in $VENV (commands linked into /usr/local/bin)"
