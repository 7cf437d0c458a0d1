#!/usr/bin/env bash
# The VS Code extension's checks, for scripts/test.sh and CI: install the pinned npm
# dependencies (package-lock.json), type-check, bundle, test (node --test, against a
# real mtgpu-server when run as root), and build the .vsix. Exits non-zero on the first
# failure. mtgpu's Python: $MTGPU_PYTHON, else $MTGPU_VENV/bin/python (as scripts/test.sh),
# else /opt/mtgpu/venv/bin/python.
set -euo pipefail
cd "$(dirname "$0")"
if [ -z "${MTGPU_PYTHON:-}" ] && [ -n "${MTGPU_VENV:-}" ]; then
  export MTGPU_PYTHON="$MTGPU_VENV/bin/python"
fi

step() {
  local name=$1
  shift
  local t0=$SECONDS
  echo "== clients/vscode: $name"
  if ! "$@"; then
    echo "== clients/vscode: $name FAILED" >&2
    exit 1
  fi
  echo "== clients/vscode: $name ok ($((SECONDS - t0)) s)"
}

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "clients/vscode: node and npm are needed (Node 20 or later)" >&2
  exit 1
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "clients/vscode: Node $(node --version) is too old; @vscode/vsce 3 needs Node 20 or later" >&2
  exit 1
fi

step "npm ci" npm ci --no-audit --no-fund
step "typecheck" npm run --silent typecheck
step "build" npm run --silent build
step "test" node --test test/*.test.mjs
step "package" npm run --silent package
ls -l ./*.vsix
