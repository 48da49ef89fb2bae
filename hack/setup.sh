#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh machine, into this checkout only:
#   .venv/            the project's Python virtual environment (pip install -e .[dev]); the machine's Python is untouched
#   ~/.cache/dds/bin  etcd, kube-apiserver, kube-scheduler, kwok and cluster-autoscaler built from source, for every
#                     Kubernetes profile (hack/versions-<profile>.env: the default one and the compatibility one;
#                     hack/build-binaries.sh --all; one progress line per binary, full logs under ~/.cache/dds/bin/logs)
# Prerequisites: Python >= 3.11 with venv, Go >= 1.26 (Kubernetes 1.36 and cluster-autoscaler 1.36 say go 1.26.0), and the Python package index and the Go module proxy reachable.
# A warm run takes about a second.
#
#   bash hack/setup.sh           both (make setup: what make test needs)
#   bash hack/setup.sh demo      .venv and only what `make demo` runs: the default profile's etcd, kwok, kube-apiserver,
#                                kube-scheduler and cluster-autoscaler (DDS_BINARIES=demo; no compatibility profile, no
#                                kube-controller-manager, no CDI operator, no helm or promtool)
#   bash hack/setup.sh python    .venv only, no Go and no binaries (make setup-python: what make unit and make lint need)
# The binaries and the tools (helm, promtool) build at the same time; the last line gives the total.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${DDS_VENV:-.venv}"
python="${PYTHON_FOR_VENV:-python3}"
say() { echo "[setup] $*" >&2; }
die() { echo "[setup] error: $*" >&2; exit 1; }
what="${1:-all}"
[[ "$what" == all || "$what" == demo || "$what" == python ]] ||
  die "unknown argument '$what': bash hack/setup.sh [demo | python]"
began=$SECONDS

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
  die "Python >= 3.11 is needed ($python is $("$python" --version 2>&1 || echo missing))"
if [[ "$what" != python ]]; then
  command -v go >/dev/null || die "Go >= 1.26 is needed to build the control-plane binaries (go not found)"
  go_minor="$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')"
  [[ "$go_minor" =~ ^[0-9]+$ ]] && (( go_minor >= 26 )) || die "Go >= 1.26 is needed (found $(go env GOVERSION))"
fi

stamp="$venv/.dds-installed"
if [[ ! -x "$venv/bin/python" ]]; then
  say "creating the project virtual environment $venv"
  "$python" -m venv "$venv" || die "could not create $venv (on Debian: apt-get install python3-venv)"
fi
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]] || ! "$venv/bin/python" -c "import dds, grpc, kubernetes, pytest" 2>/dev/null; then
  say "installing Python dependencies into $venv (pip install -e .[dev]; log: $venv/pip.log)"
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check -e '.[dev]' >"$venv/pip.log" 2>&1; then
    tail -n 20 "$venv/pip.log" >&2
    die "pip install failed; full log: $venv/pip.log"
  fi
  touch "$stamp"
fi
if [[ "$what" == python ]]; then exit 0; fi
# A total is printed only when something was built: a warm run stays silent.
total() {
  local took=$(( SECONDS - began ))
  (( took > 1 )) && say "ready in $(( took / 60 )) min $(( took % 60 )) s" || true
}
if [[ "$what" == demo ]]; then
  DDS_BINARIES=demo bash hack/build-binaries.sh >/dev/null
  total
  exit 0
fi
# helm and promtool, built from their Go modules: the chart, alert and dashboard checks of make test. Beside the
# binaries' builds: they share no module and each waits on downloads part of the time.
bash hack/build-tools.sh >/dev/null &
tools=$!
binaries_ok=0
bash hack/build-binaries.sh --all >/dev/null || binaries_ok=$?
tools_ok=0
wait "$tools" || tools_ok=$?
(( binaries_ok == 0 )) || die "hack/build-binaries.sh failed (its error is above)"
(( tools_ok == 0 )) || die "hack/build-tools.sh failed (its error is above)"
total
