#!/usr/bin/env bash
# Builds (once) and caches the pinned binaries the tests and `make demo` run as local processes: etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager (DRA tests only), kwok, the real cluster-autoscaler and the
# CDI operator `cro-manager` (composability tests only). Prints the bin directory on its last line.
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
cache="${DDS_BIN_CACHE:-$HOME/.cache/dds/bin}"
logs="$cache/logs"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
mkdir -p "$cache" "$logs"
log() { echo "[build-binaries] $*" >&2; }
die() { echo "[build-binaries] error: $*" >&2; exit 1; }

staging_modules=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
  cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client
  csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
  kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
  sample-apiserver sample-cli-plugin sample-controller)

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
  for m in "${staging_modules[@]}"; do run kubernetes go mod edit -replace "k8s.io/$m=k8s.io/$m@$KUBERNETES_STAGING_VERSION"; done
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
  for m in "${staging_modules[@]}"; do
    run kube-controller-manager go mod edit -replace "k8s.io/$m=k8s.io/$m@$KUBERNETES_STAGING_VERSION"
  done
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
# pinned source archive in shared/third_party (checksum verified). Its CRDs, RBAC and webhook configuration from the same
# tree are cached beside the binary under config/, so the tests install the upstream files, never a copy kept here.
build_cro_manager() {
  local short="${CRO_COMMIT:0:7}"
  local out="$cache/cro-manager-$short"
  if [[ -x "$out/cro-manager" && -f "$out/config/webhook/manifests.yaml" ]]; then return; fi
  local src="$repo/../shared/third_party/$CRO_SOURCE_ARCHIVE" w="$cache/wrappers/cro-manager-$short" got
  [[ -f "$src" ]] || die "CDI operator source not found: $src (expected the upstream composable-resource-operator
  $short source archive in shared/third_party beside this repository)"
  got="$(sha256sum "$src" | cut -d' ' -f1)"
  [[ "$got" == "$CRO_SOURCE_SHA256" ]] || die "CDI operator source $src has sha256 $got, expected $CRO_SOURCE_SHA256
  (corrupt or another commit)"
  building cro-manager "$short"
  rm -rf "$w" "$out.tmp"; mkdir -p "$w" "$out.tmp/config/crd/bases" "$out.tmp/config/rbac" "$out.tmp/config/webhook"
  tar -xzf "$src" -C "$w" || die "cannot unpack CDI operator source $src"
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

start=$(date +%s)
build_etcd
build_kwok
build_kubernetes
build_kube_controller_manager
build_cluster_autoscaler
build_cro_manager
bin="$cache/current"
rm -rf "$bin"; mkdir -p "$bin"
ln -sf "$cache/etcd-$ETCD_VERSION/etcd" "$bin/etcd"
ln -sf "$cache/kwok-$KWOK_VERSION/kwok" "$bin/kwok"
ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-apiserver" "$bin/kube-apiserver"
ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-scheduler" "$bin/kube-scheduler"
ln -sf "$cache/kube-controller-manager-$KUBERNETES_VERSION/kube-controller-manager" "$bin/kube-controller-manager"
ln -sf "$cache/cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION/cluster-autoscaler" "$bin/cluster-autoscaler"
ln -sf "$cache/cro-manager-${CRO_COMMIT:0:7}/cro-manager" "$bin/cro-manager"
elapsed=$(( $(date +%s) - start ))
(( elapsed > 1 )) && log "binaries ready in $elapsed s: $bin"
echo "$bin"
