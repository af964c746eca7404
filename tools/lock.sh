#!/usr/bin/env bash
# Locks gpuheal's runtime dependencies: every package the image and the test
# environment install, at one version, with the sha256 of each of its files on the
# index (amd64 and arm64 wheels alike: one lock for both images). `make lock` runs
# it after a change to pyproject.toml's dependencies; tests/unit/test_lock.py holds
# the venv and pyproject.toml to it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
uv="${UV:-$root/.venv/bin/uv}"
cd "$root"
"$uv" pip compile pyproject.toml --generate-hashes --universal --python-version 3.11 \
  --no-header --quiet -o deploy/docker/requirements.lock
{
  echo "# gpuheal's runtime dependencies, locked by tools/lock.sh (make lock): pyproject.toml's"
  echo "# dependencies resolved for CPython >= 3.11 on every platform, each file's hash."
  cat deploy/docker/requirements.lock
} > deploy/docker/requirements.lock.new
mv deploy/docker/requirements.lock.new deploy/docker/requirements.lock
