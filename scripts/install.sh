#!/usr/bin/env bash
# Install mtgpu on this Debian machine: the distribution packages it uses, then the
# Python package into /opt/mtgpu/venv (outside /root, so tenants can run the CLIs).
#   bash scripts/install.sh            the node
#   bash scripts/install.sh --test     the node plus the test tools
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MTGPU_VENV:-/opt/mtgpu/venv}
# The packages, each with why it is needed, are listed once in mtgpu/setup/packages.txt
# (`mtgpu-setup install` reads the same file): the "node" ones, and with --test the "test" ones.
roles="node"
EXTRA=""
if [ "${1:-}" = "--test" ]; then
  roles="node test"
  EXTRA="[test]"
fi
PACKAGES=()
while read -r role name _; do
  case "$role" in ''|\#*) continue ;; esac
  case " $roles " in *" $role "*) PACKAGES+=("$name") ;; esac
done < mtgpu/setup/packages.txt
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
# the client distribution (clients/python: remotegpu-cli and what it imports) and the server, which
# depends on it; the client once more alone: an mtgpu from before the split owned the client's files
# too, and pip removes them when it replaces that one, after it installed the client
"$VENV/bin/python" -m pip install -q ./clients/python ".$EXTRA"
"$VENV/bin/python" -m pip install -q --no-deps --force-reinstall ./clients/python
# the devcontainer.json reference for tests/integration/test_devcontainer_reference.py (Node >= 20;
# Debian 12's own nodejs is 18: then that test says it is skipped and why)
if [ -n "$EXTRA" ] && command -v npm >/dev/null && node -e 'process.exit(parseInt(process.versions.node) >= 20 ? 0 : 1)'; then
  npm ci --prefix tests/tools/devcontainer-cli --no-audit --no-fund --loglevel=error
fi
# the scheduler's compiled scoring (mtgpu/sched/fragjit.py): compiled now, into the package's
# __pycache__, not in a big cluster's first pass (some seconds); a failure here costs only that
(cd / && "$VENV/bin/python" -I -m mtgpu.sched.fragjit) || echo "scripts/install.sh: the scheduler's compiled scoring did not compile now; the first pass on a fleet of 64+ nodes compiles it" >&2
chmod -R a+rX "$(dirname "$VENV")"
for cmd in mtgpu-server mtgpu-admin mt-job mtgpu-setup mt-python mt-podman mt-container remotegpu-cli; do
  ln -sf "$VENV/bin/$cmd" "/usr/local/bin/$cmd"
done
echo "mtgpu installed in $VENV (commands linked into /usr/local/bin)"
