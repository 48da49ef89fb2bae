#!/usr/bin/env bash
# Builds (once) and caches the two checking tools the chart/alert/dashboard tests run: helm (helm lint, helm template)
# and promtool (promtool check rules, promtool test rules, expression parsing). Both are built from their Go modules
# through the module proxy — never downloaded as prebuilt binaries — into
#   ${DDS_BIN_CACHE:-$HOME/.cache/dds/bin}/tools-helm-<ver>-promtool-<ver>/{helm,promtool}
# and the cache is keyed by the pinned versions (hack/versions.env: HELM_VERSION, PROMETHEUS_VERSION), so a version
# change builds a new directory beside the old one. Prints that directory on its last line.
#
# Cold (empty module and build caches, 2 cores shared with a Kubernetes build): helm 697 s, promtool 440 s, 19 min in
# all (8.5 min of CPU; the rest module downloads and waiting for the cores). With the module cache warm: about 2 min
# each. A warm run only checks that both binaries exist.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
: "${HELM_VERSION:?hack/versions.env must pin HELM_VERSION}"
: "${PROMETHEUS_VERSION:?hack/versions.env must pin PROMETHEUS_VERSION}"
cache="${DDS_BIN_CACHE:-$HOME/.cache/dds/bin}"
dest="$cache/tools-helm-$HELM_VERSION-promtool-$PROMETHEUS_VERSION"
logs="$cache/logs"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
log() { echo "[build-tools] $*" >&2; }
die() { echo "[build-tools] error: $*" >&2; exit 1; }
command -v go >/dev/null || die "Go is needed to build helm and promtool (go not found)"
mkdir -p "$dest" "$logs"

# build NAME MODULE_PATH@VERSION LDFLAGS [TAGS]: go install into a scratch GOBIN, then a rename, so an interrupted build
# never leaves a half-written binary the tests would take for a good one.
build() {
  local name="$1" target="$2" ldflags="$3" tags="${4:-}"
  [[ -x "$dest/$name" ]] && return 0
  local scratch="$dest/.gobin-$name" start
  rm -rf "$scratch"; mkdir -p "$scratch"
  : >"$logs/$name.log"
  log "building $name from $target (log: $logs/$name.log)"
  start=$(date +%s)
  if ! GOBIN="$scratch" go install -trimpath -tags "$tags" -ldflags "$ldflags" "$target" >>"$logs/$name.log" 2>&1; then
    tail -n 25 "$logs/$name.log" >&2
    die "building $name failed; full log: $logs/$name.log"
  fi
  mv "$scratch/$name" "$dest/$name"
  rm -rf "$scratch"
  log "built $name in $(( $(date +%s) - start )) s"
}

# The version strings the binaries print (helm version, promtool --version) are set the way their release builds do,
# and so is the Kubernetes version helm assumes without a cluster (`helm template`, `helm lint`): the minor of the
# client-go its go.mod requires (left unset, helm would assume 1.20 and refuse charts that need newer).
helm_k8s_flags() {
  local gomod client_go minor
  gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod")"
  minor="${client_go#v0.}"; minor="${minor%%.*}"
  [[ "$minor" =~ ^[0-9]+$ ]] || die "could not read k8s.io/client-go's version from helm's go.mod ($gomod)"
  local flags=""
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  echo "$flags"
}
[[ -x "$dest/helm" ]] || build helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
  "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION$(helm_k8s_flags)"
# Prometheus 3.x publishes its Go module as v0.3MM.P for release 3.MM.P.
prom_minor="${PROMETHEUS_VERSION#v0.}"; prom_minor="${prom_minor%%.*}"
prom_release="3.$(( 10#$prom_minor - 300 )).${PROMETHEUS_VERSION##*.}"
# remove_all_sd leaves out every service-discovery plugin (cloud SDKs, half the compile time): checking and testing
# rules and parsing expressions need none of them (`promtool check config` on a config using one would).
build promtool "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" \
  "-s -w -X github.com/prometheus/common/version.Version=$prom_release" remove_all_sd
echo "$dest"
