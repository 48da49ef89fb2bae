#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh machine; a warm run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=".cache/setup.stamp"
mkdir -p .cache
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]] || ! python3 -c "import dds, grpc, kubernetes, pytest" 2>/dev/null; then
  echo "[setup] installing Python dependencies (pip install -e .[dev])" >&2
  python3 -m pip install --disable-pip-version-check -q -e '.[dev]'
  touch "$stamp"
fi
bash hack/build-binaries.sh >/dev/null
