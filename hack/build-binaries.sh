#!/usr/bin/env bash
# Builds (once) and caches the pinned control-plane binaries: etcd, kube-apiserver, kube-scheduler, kwok, and
# cluster-autoscaler when its module can be had. Prints the bin directory on its last line.
# A warm run only checks that the cached binaries exist: seconds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${DDS_BIN_CACHE:-$HOME/.cache/dds/bin}"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
mkdir -p "$cache"
log() { echo "[build-binaries] $*" >&2; }

staging_modules=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
  cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client
  csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
  kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
  sample-apiserver sample-cli-plugin sample-controller)

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
  log "building kube-apiserver and kube-scheduler $KUBERNETES_VERSION (cold: tens of minutes on 2 cores)"
  local w="$cache/wrappers/kubernetes-$KUBERNETES_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  go mod init dds.local/wrapper/kubernetes >/dev/null 2>&1
  go mod edit -go="$KUBERNETES_GO_DIRECTIVE" -godebug="default=$KUBERNETES_GODEBUG"
  for m in "${staging_modules[@]}"; do go mod edit -replace "k8s.io/$m=k8s.io/$m@$KUBERNETES_STAGING_VERSION"; done
  go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" "k8s.io/kubernetes/cmd/kube-scheduler@$KUBERNETES_VERSION"
  mkdir -p "$out.tmp"
  go build -trimpath -ldflags "$(k8s_ldflags "$KUBERNETES_VERSION")" -o "$out.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
  rm -rf "$out"; mv "$out.tmp" "$out"
}

build_etcd() {
  local out="$cache/etcd-$ETCD_VERSION"
  if [[ -x "$out/etcd" ]]; then return; fi
  log "building etcd $ETCD_VERSION"
  local w="$cache/wrappers/etcd-$ETCD_VERSION"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  go mod init dds.local/wrapper/etcd >/dev/null 2>&1
  go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  mkdir -p "$out.tmp"
  go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  rm -rf "$out"; mv "$out.tmp" "$out"
}

build_kwok() {
  local out="$cache/kwok-$KWOK_VERSION"
  if [[ -x "$out/kwok" ]]; then return; fi
  log "building kwok $KWOK_VERSION"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" GOFLAGS= go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  rm -rf "$out"; mv "$out.tmp" "$out"
}

build_cluster_autoscaler() {
  local out="$cache/cluster-autoscaler-$CLUSTER_AUTOSCALER_TAG"
  if [[ -x "$out/cluster-autoscaler" ]]; then return; fi
  # The module is only reachable where the Go module proxy serves k8s.io/autoscaler; say so instead of failing the rest.
  if ! go list -m "k8s.io/autoscaler/cluster-autoscaler@$CLUSTER_AUTOSCALER_PSEUDO_VERSION" >/dev/null 2>&1; then
    log "cluster-autoscaler: module k8s.io/autoscaler/cluster-autoscaler@$CLUSTER_AUTOSCALER_PSEUDO_VERSION is not served by $(go env GOPROXY); skipped"
    return
  fi
  log "building cluster-autoscaler $CLUSTER_AUTOSCALER_TAG (externalgrpc only)"
  local w="$cache/wrappers/cluster-autoscaler-$CLUSTER_AUTOSCALER_TAG"
  rm -rf "$w"; mkdir -p "$w"; cd "$w"
  go mod init dds.local/wrapper/cluster-autoscaler >/dev/null 2>&1
  go mod edit -go="$KUBERNETES_GO_DIRECTIVE" -godebug="default=$KUBERNETES_GODEBUG"
  for m in "${staging_modules[@]}"; do go mod edit -replace "k8s.io/$m=k8s.io/$m@$KUBERNETES_STAGING_VERSION"; done
  go mod edit -replace "github.com/aws/aws-sdk-go/service/eks=github.com/aws/aws-sdk-go/service/eks@v1.38.49" \
    -replace "github.com/rancher/go-rancher=github.com/rancher/go-rancher@v0.1.0" \
    -replace "k8s.io/autoscaler/cluster-autoscaler/apis=k8s.io/autoscaler/cluster-autoscaler/apis@$CLUSTER_AUTOSCALER_PSEUDO_VERSION"
  go get -tool "k8s.io/autoscaler/cluster-autoscaler@$CLUSTER_AUTOSCALER_PSEUDO_VERSION"
  mkdir -p "$out.tmp"
  go build -trimpath -tags externalgrpc -ldflags "-s -w" -o "$out.tmp/cluster-autoscaler" k8s.io/autoscaler/cluster-autoscaler
  rm -rf "$out"; mv "$out.tmp" "$out"
}

start=$(date +%s)
build_etcd
build_kwok
build_kubernetes
build_cluster_autoscaler
bin="$cache/current"
rm -rf "$bin"; mkdir -p "$bin"
ln -sf "$cache/etcd-$ETCD_VERSION/etcd" "$bin/etcd"
ln -sf "$cache/kwok-$KWOK_VERSION/kwok" "$bin/kwok"
ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-apiserver" "$bin/kube-apiserver"
ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-scheduler" "$bin/kube-scheduler"
[[ -x "$cache/cluster-autoscaler-$CLUSTER_AUTOSCALER_TAG/cluster-autoscaler" ]] && \
  ln -sf "$cache/cluster-autoscaler-$CLUSTER_AUTOSCALER_TAG/cluster-autoscaler" "$bin/cluster-autoscaler"
log "done in $(( $(date +%s) - start )) s"
echo "$bin"
