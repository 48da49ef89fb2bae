#!/usr/bin/env bash
# Builds (once) and caches the pinned binaries the tests and `make demo` run as local processes: etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager (DRA tests only), kwok, the real cluster-autoscaler and the
# CDI operator `cro-manager` (composability tests only). Prints the bin directory on its last line.
#
#   bash hack/build-binaries.sh            the profile $DDS_K8S_PROFILE, else hack/versions.env's default profile
#   bash hack/build-binaries.sh 1.35       that Kubernetes profile (hack/versions-1.35.env)
#   bash hack/build-binaries.sh --all      every profile (hack/setup.sh); prints the default profile's directory
#
# A profile pins the control plane and the cluster-autoscaler of one Kubernetes minor (hack/versions-<profile>.env);
# etcd, kwok and cro-manager are shared. Each profile's binaries are symlinked into $cache/k8s-<profile>; the default
# profile's also into $cache/current.
#
# Quiet by design: one line per binary on stderr; the Go tool's output goes to a log file the line names.
# A warm run only checks that the cached binaries exist (well under a second).
#
# cluster-autoscaler is built from upstream source, never downloaded as a binary: by default from the pruned 1.35.2
# source archive in shared/third_party (checksum verified), or from DDS_CA_SOURCE — a directory holding a checkout of
# the upstream tag (its cluster-autoscaler/ folder or the folder itself) or another archive of it
# (then DDS_CA_SOURCE_SHA256 pins that archive's checksum). A missing or corrupt source is an error, never a fallback.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
: "${DDS_DEFAULT_K8S_PROFILE:?hack/versions.env must name DDS_DEFAULT_K8S_PROFILE}"
cache="${DDS_BIN_CACHE:-$HOME/.cache/dds/bin}"
logs="$cache/logs"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
mkdir -p "$cache" "$logs"
# One run at a time per cache: two runs building the same version would share its wrapper and output folders (the
# harness runs this script at the start of every test session, and several sessions may start together). A warm run
# holds the lock for well under a second.
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
  echo "[build-binaries] waiting for another build-binaries.sh run to finish (lock: $cache/.build.lock)" >&2
  flock 9
fi
log() { echo "[build-binaries] $*" >&2; }
die() { echo "[build-binaries] error: $*" >&2; exit 1; }

# profiles: every Kubernetes profile hack/ pins (versions-<profile>.env), one a line.
profiles() { local f; for f in "$here"/versions-*.env; do f="${f##*/versions-}"; echo "${f%.env}"; done; }

# load_profile PROFILE: reads its pins over the shared ones; an unknown profile is an error naming the known ones.
load_profile() {
  local file="$here/versions-$1.env"
  [[ -f "$file" ]] || die "no Kubernetes profile '$1' (no $file); known profiles: $(profiles | tr '\n' ' ')"
  unset KUBERNETES_VERSION KUBERNETES_STAGING_VERSION KUBERNETES_GO_DIRECTIVE KUBERNETES_GODEBUG \
    CLUSTER_AUTOSCALER_TAG CLUSTER_AUTOSCALER_VERSION CLUSTER_AUTOSCALER_SOURCE_ARCHIVE CLUSTER_AUTOSCALER_SOURCE_SHA256
  # shellcheck source=versions-1.36.env
  source "$file"
  local key
  for key in KUBERNETES_VERSION KUBERNETES_STAGING_VERSION KUBERNETES_GO_DIRECTIVE KUBERNETES_GODEBUG \
    CLUSTER_AUTOSCALER_TAG CLUSTER_AUTOSCALER_VERSION CLUSTER_AUTOSCALER_SOURCE_ARCHIVE CLUSTER_AUTOSCALER_SOURCE_SHA256; do
    [[ -n "${!key:-}" ]] || die "$file pins no $key"
  done
}

# replace_staging_modules NAME: in the current wrapper module, points every staging module k8s.io/kubernetes replaces
# with ./staging/src/k8s.io/<m> at its published version. The list is read from that release's own go.mod, so it follows
# the release (1.36 added cri-streaming and streaming).
replace_staging_modules() {
  local name="$1" gomod m
  gomod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" 2>>"$logs/$name.log" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$gomod" ]] || { tail -n 25 "$logs/$name.log" >&2; die "k8s.io/kubernetes@$KUBERNETES_VERSION: no go.mod from the module proxy"; }
  local modules
  modules="$(sed -n 's#^[[:space:]]*k8s.io/\([a-z0-9-]*\) => ./staging/src/k8s.io/.*#\1#p' "$gomod")"
  [[ -n "$modules" ]] || die "k8s.io/kubernetes@$KUBERNETES_VERSION's go.mod ($gomod) replaces no staging module"
  for m in $modules; do run "$name" go mod edit -replace "k8s.io/$m=k8s.io/$m@$KUBERNETES_STAGING_VERSION"; done
}

# run NAME CMD...: runs one build step with its output in the binary's log; on failure shows the log's tail.
run() {
  local name="$1"; shift
  if ! "$@" >>"$logs/$name.log" 2>&1; then
    tail -n 25 "$logs/$name.log" >&2
    die "building $name failed; full log: $logs/$name.log"
  fi
}

# building NAME VERSION: the one progress line a build prints, and a fresh log.
building() {
  : >"$logs/$1.log"
  log "building $1 $2 (log: $logs/$1.log)"
  step_start=$(date +%s)
}
built() { log "built $1 in $(( $(date +%s) - step_start )) s"; }

k8s_ldflags() {
  local v="$1" major minor
  major="${v#v}"; major="${major%%.*}"; minor="${v#v*.}"; minor="${minor%%.*}"
  local flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=0000000000000000000000000000000000000000"
    flags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "-s -w$flags"
}

build_kubernetes() {
  local out="$cache/kubernetes-$KUBERNETES_VERSION"
  if [[ -x "$out/kube-apiserver" && -x "$out/kube-scheduler" ]]; then return; fi
  building kubernetes "$KUBERNETES_VERSION"
  local w="$cache/wrappers/kubernetes-$KUBERNETES_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  run kubernetes go mod init dds.local/wrapper/kubernetes
  run kubernetes go mod edit -go="$KUBERNETES_GO_DIRECTIVE" -godebug="default=$KUBERNETES_GODEBUG"
  replace_staging_modules kubernetes
  run kubernetes go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" \
    "k8s.io/kubernetes/cmd/kube-scheduler@$KUBERNETES_VERSION"
  mkdir -p "$out.tmp"
  run kubernetes go build -trimpath -ldflags "$(k8s_ldflags "$KUBERNETES_VERSION")" -o "$out.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
  rm -rf "$out"; mv "$out.tmp" "$out"
  built kubernetes
}

# kube-controller-manager runs only its resourceclaim controller in the harness (ResourceClaims from templates, claims
# released when their pods end: docs/dra.md). Its own wrapper and output folder, so a cache holding the apiserver and
# scheduler builds only this binary; the Go build cache shares every package it has in common with them.
build_kube_controller_manager() {
  local out="$cache/kube-controller-manager-$KUBERNETES_VERSION"
  if [[ -x "$out/kube-controller-manager" ]]; then return; fi
  building kube-controller-manager "$KUBERNETES_VERSION"
  local w="$cache/wrappers/kube-controller-manager-$KUBERNETES_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  run kube-controller-manager go mod init dds.local/wrapper/kube-controller-manager
  run kube-controller-manager go mod edit -go="$KUBERNETES_GO_DIRECTIVE" -godebug="default=$KUBERNETES_GODEBUG"
  replace_staging_modules kube-controller-manager
  run kube-controller-manager go get -tool "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBERNETES_VERSION"
  mkdir -p "$out.tmp"
  run kube-controller-manager go build -trimpath -ldflags "$(k8s_ldflags "$KUBERNETES_VERSION")" -o "$out.tmp/" \
    k8s.io/kubernetes/cmd/kube-controller-manager
  rm -rf "$out"; mv "$out.tmp" "$out"
  built kube-controller-manager
}

build_etcd() {
  local out="$cache/etcd-$ETCD_VERSION"
  if [[ -x "$out/etcd" ]]; then return; fi
  building etcd "$ETCD_VERSION"
  local w="$cache/wrappers/etcd-$ETCD_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  run etcd go mod init dds.local/wrapper/etcd
  run etcd go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  mkdir -p "$out.tmp"
  run etcd go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  rm -rf "$out"; mv "$out.tmp" "$out"
  built etcd
}

build_kwok() {
  local out="$cache/kwok-$KWOK_VERSION"
  if [[ -x "$out/kwok" ]]; then return; fi
  building kwok "$KWOK_VERSION"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" GOFLAGS= run kwok go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  rm -rf "$out"; mv "$out.tmp" "$out"
  built kwok
}

# ca_source_dir WORKDIR: prints the cluster-autoscaler module directory to build, unpacking an archive into WORKDIR.
ca_source_dir() {
  local w="$1" src="${DDS_CA_SOURCE:-$repo/../shared/third_party/$CLUSTER_AUTOSCALER_SOURCE_ARCHIVE}"
  local want="${DDS_CA_SOURCE_SHA256:-$CLUSTER_AUTOSCALER_SOURCE_SHA256}" dir
  if [[ -d "$src" ]]; then
    dir="$src"; [[ -d "$src/cluster-autoscaler" ]] && dir="$src/cluster-autoscaler"
  elif [[ -f "$src" ]]; then
    local got
    got="$(sha256sum "$src" | cut -d' ' -f1)"
    [[ "$got" == "$want" ]] || die "cluster-autoscaler source $src has sha256 $got, expected $want (corrupt or another
  version; set DDS_CA_SOURCE_SHA256 for an archive of your own)"
    tar -xzf "$src" -C "$w" || die "cannot unpack cluster-autoscaler source $src"
    dir="$w/cluster-autoscaler"
  else
    die "cluster-autoscaler source not found: $src (expected the upstream $CLUSTER_AUTOSCALER_TAG source archive in
  shared/third_party beside this repository, or DDS_CA_SOURCE=/path/to/a/checkout-or-archive of that tag)"
  fi
  local version_go="$dir/version/version.go"
  [[ -f "$dir/go.mod" && -f "$version_go" ]] || die "$src holds no cluster-autoscaler module (no go.mod / version/version.go)"
  grep -q "ClusterAutoscalerVersion = \"$CLUSTER_AUTOSCALER_VERSION\"" "$version_go" ||
    die "$src is not cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION: $(grep ClusterAutoscalerVersion "$version_go" | tail -1)"
  echo "$dir"
}

build_cluster_autoscaler() {
  local out="$cache/cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION"
  if [[ -x "$out/cluster-autoscaler" ]]; then return; fi
  local w="$cache/wrappers/cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION" dir
  rm -rf "$w"; mkdir -p "$w"
  dir="$(ca_source_dir "$w")"
  building cluster-autoscaler "$CLUSTER_AUTOSCALER_VERSION"
  mkdir -p "$out.tmp"
  (cd "$dir" && run cluster-autoscaler go build -trimpath -tags externalgrpc -ldflags "-s -w" \
    -o "$out.tmp/cluster-autoscaler" .)
  rm -rf "$out" "$w"; mv "$out.tmp" "$out"
  built cluster-autoscaler
}

# The CDI operator (CoHDI composable-resource-operator) for the composability tests (harness/cdi_operator.py), from the
# pinned source archive in shared/third_party (checksum verified), or from DDS_CRO_SOURCE: another archive of that
# commit (DDS_CRO_SOURCE_SHA256 pins its checksum) or a directory laid out as the archive is (composable-resource-operator/
# and cluster-api-provider-metal3-api/ side by side; copied, never built in place). Its CRDs, RBAC and webhook
# configuration from the same tree are cached beside the binary under config/, so the tests install the upstream files,
# never a copy kept here.
build_cro_manager() {
  local short="${CRO_COMMIT:0:7}"
  local out="$cache/cro-manager-$short"
  if [[ -x "$out/cro-manager" && -f "$out/config/webhook/manifests.yaml" ]]; then return; fi
  local src="${DDS_CRO_SOURCE:-$repo/../shared/third_party/$CRO_SOURCE_ARCHIVE}" w="$cache/wrappers/cro-manager-$short" got
  local want="${DDS_CRO_SOURCE_SHA256:-$CRO_SOURCE_SHA256}"
  if [[ -d "$src" ]]; then
    [[ -f "$src/composable-resource-operator/go.mod" ]] || die "DDS_CRO_SOURCE $src holds no composable-resource-operator/
  module (expected the layout of the upstream $short source archive)"
  else
    [[ -f "$src" ]] || die "CDI operator source not found: $src (expected the upstream composable-resource-operator
  $short source archive in shared/third_party beside this repository, or DDS_CRO_SOURCE=/path/to/an-archive-or-directory)"
    got="$(sha256sum "$src" | cut -d' ' -f1)"
    [[ "$got" == "$want" ]] || die "CDI operator source $src has sha256 $got, expected $want
  (corrupt or another commit; set DDS_CRO_SOURCE_SHA256 for an archive of your own)"
  fi
  building cro-manager "$short"
  rm -rf "$w" "$out.tmp"; mkdir -p "$w" "$out.tmp/config/crd/bases" "$out.tmp/config/rbac" "$out.tmp/config/webhook"
  if [[ -d "$src" ]]; then
    cp -r "$src"/. "$w"/ || die "cannot copy CDI operator source $src"
  else
    tar -xzf "$src" -C "$w" || die "cannot unpack CDI operator source $src"
  fi
  local dir="$w/composable-resource-operator"
  # The metal3 `api` module ships inside the archive: the module proxy refuses it. The edit is in the extracted copy.
  (cd "$dir" && run cro-manager go mod edit \
    -replace github.com/metal3-io/cluster-api-provider-metal3/api=../cluster-api-provider-metal3-api &&
    run cro-manager go build -trimpath -ldflags "-s -w" -o "$out.tmp/cro-manager" ./cmd)
  cp "$dir"/config/crd/bases/*.yaml "$out.tmp/config/crd/bases/"
  cp "$dir"/config/rbac/*.yaml "$out.tmp/config/rbac/"
  cp "$dir/config/webhook/manifests.yaml" "$out.tmp/config/webhook/"
  rm -rf "$out" "$w"; mv "$out.tmp" "$out"
  built cro-manager
}

# link_profile PROFILE DIR: DIR becomes a directory of symlinks to that profile's binaries (the harness's bin dir).
link_profile() {
  local bin="$2"
  rm -rf "$bin.tmp"; mkdir -p "$bin.tmp"
  ln -sf "$cache/etcd-$ETCD_VERSION/etcd" "$bin.tmp/etcd"
  ln -sf "$cache/kwok-$KWOK_VERSION/kwok" "$bin.tmp/kwok"
  ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-apiserver" "$bin.tmp/kube-apiserver"
  ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-scheduler" "$bin.tmp/kube-scheduler"
  ln -sf "$cache/kube-controller-manager-$KUBERNETES_VERSION/kube-controller-manager" "$bin.tmp/kube-controller-manager"
  ln -sf "$cache/cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION/cluster-autoscaler" "$bin.tmp/cluster-autoscaler"
  ln -sf "$cache/cro-manager-${CRO_COMMIT:0:7}/cro-manager" "$bin.tmp/cro-manager"
  echo "profile=$1 kubernetes=$KUBERNETES_VERSION cluster-autoscaler=$CLUSTER_AUTOSCALER_VERSION" >"$bin.tmp/PROFILE"
  # Swapped in whole, so a test resolving the directory meanwhile sees the old set or the new one, never half of one.
  rm -rf "$bin.old"; [[ -e "$bin" ]] && mv "$bin" "$bin.old"
  mv "$bin.tmp" "$bin"; rm -rf "$bin.old"
}

# build_profile PROFILE: builds that profile's binaries (and the shared ones) and links its bin dir; prints nothing.
build_profile() {
  load_profile "$1"
  build_etcd
  build_kwok
  build_kubernetes
  build_kube_controller_manager
  build_cluster_autoscaler
  build_cro_manager
  local bin="$cache/k8s-$1"
  # A warm run relinks nothing: tests of another profile may be reading the directories right now.
  [[ "$(cat "$bin/PROFILE" 2>/dev/null)" == "profile=$1 kubernetes=$KUBERNETES_VERSION cluster-autoscaler=$CLUSTER_AUTOSCALER_VERSION" ]] ||
    link_profile "$1" "$bin"
  if [[ "$1" == "$DDS_DEFAULT_K8S_PROFILE" &&
        "$(cat "$cache/current/PROFILE" 2>/dev/null)" != "$(cat "$bin/PROFILE")" ]]; then
    link_profile "$1" "$cache/current"
  fi
}

case "${1:-}" in
  --all) wanted=($(profiles)) selected="$DDS_DEFAULT_K8S_PROFILE" ;;
  "") selected="${DDS_K8S_PROFILE:-$DDS_DEFAULT_K8S_PROFILE}"; wanted=("$selected") ;;
  -*) die "unknown option $1 (usage: build-binaries.sh [PROFILE | --all])" ;;
  *) selected="$1"; wanted=("$1") ;;
esac
[[ -f "$here/versions-$selected.env" ]] ||
  die "no Kubernetes profile '$selected' (DDS_K8S_PROFILE or the argument); known profiles: $(profiles | tr '\n' ' ')"
start=$(date +%s)
for profile in "${wanted[@]}"; do build_profile "$profile"; done
elapsed=$(( $(date +%s) - start ))
(( elapsed > 1 )) && log "binaries ready in $elapsed s: $cache/k8s-$selected (profile $selected)"
echo "$cache/k8s-$selected"
