#!/usr/bin/env bash
# DDS in a kind cluster, for machines WITH Docker (the test suite runs without Docker: see `make test`).
#
#   hack/kind-up.sh            # create (or reuse) kind cluster "dds" and deploy everything
#
# What it does, in order:
#   1. creates the kind cluster (reused when it exists)
#   2. builds the DDS image from ./Dockerfile and loads it into kind
#   3. installs the CRDs (Cluster API subset, ComposabilityRequest) and waits until they are Established
#   4. installs kwok in the cluster (its controller and the "fast" stages) to play the GPU worker nodes
#   5. writes mTLS material with `dds certs` (run from the image) and applies the two Secrets
#   6. applies manifests/overlays/kind (DDS x2 with leader election and node_backend kwok — kind runs no Cluster API
#      controllers, so the leader turns MachineSet replicas into Machines and kwok Nodes itself —, cluster-autoscaler
#      with --cloud-provider=externalgrpc)
#   7. applies the demo MachineSet (manifests/examples/): its one replica becomes a kwok node, to which DDS attaches
#      the group's boot-time GPU
#   8. prints how to run the demo
#
# Environment: DDS_KIND_CLUSTER (default dds), DDS_IMAGE (default ghcr.io/dds-project/dds:dev),
# DDS_KIND_NODE_IMAGE (a kindest/node image; default: kind's own), DDS_WORKDIR (default ./.cache/kind-<cluster>).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/versions.env
source "${ROOT}/hack/versions.env"

CLUSTER="${DDS_KIND_CLUSTER:-dds}"
IMAGE="${DDS_IMAGE:-ghcr.io/dds-project/dds:dev}"
WORKDIR="${DDS_WORKDIR:-${ROOT}/.cache/kind-${CLUSTER}}"
CONTEXT="kind-${CLUSTER}"
KWOK_RELEASE="https://github.com/kubernetes-sigs/kwok/releases/download/${KWOK_VERSION}"
DEMO_NAMESPACE="default"
DEMO_MACHINESET="gpu-workers"
DEMO_NODE="gpu-workers-0"

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'kind-up: %s\n' "$*" >&2; exit 1; }
kube() { kubectl --context "${CONTEXT}" "$@"; }

require_tools() {
  local tool
  for tool in docker kind kubectl; do
    command -v "${tool}" >/dev/null 2>&1 || die "${tool} is required (docker: a running engine; kind, kubectl: in PATH)"
  done
  docker info >/dev/null 2>&1 || die "docker is installed but the engine does not answer (is the daemon running?)"
}

create_cluster() {
  if kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
    log "reusing kind cluster ${CLUSTER}"
    return
  fi
  log "creating kind cluster ${CLUSTER}"
  local args=(create cluster --name "${CLUSTER}" --wait 120s)
  if [[ -n "${DDS_KIND_NODE_IMAGE:-}" ]]; then
    args+=(--image "${DDS_KIND_NODE_IMAGE}")
  fi
  kind "${args[@]}"
}

build_image() {
  log "building ${IMAGE} and loading it into kind"
  docker build --tag "${IMAGE}" "${ROOT}"
  kind load docker-image "${IMAGE}" --name "${CLUSTER}"
}

install_crds() {
  log "installing CRDs from manifests/crds/"
  kube apply --server-side --recursive --filename "${ROOT}/manifests/crds"
  kube wait --for condition=Established --timeout 60s crd --all
}

install_kwok() {
  log "installing kwok ${KWOK_VERSION} in the cluster"
  kube apply --filename "${KWOK_RELEASE}/kwok.yaml"
  kube apply --filename "${KWOK_RELEASE}/stage-fast.yaml"
  kube -n kube-system rollout status deployment/kwok-controller --timeout 120s
}

write_certs() {
  log "writing mTLS material to ${WORKDIR}/tls"
  mkdir -p "${WORKDIR}/tls"
  # The image's `dds certs`, so no local Python is needed. --files-dir: where cluster-autoscaler mounts the Secret.
  # --force: a re-run replaces the CAs of the last one, and both Secrets are applied together below.
  docker run --rm --user "$(id -u):$(id -g)" --volume "${WORKDIR}/tls:/out" "${IMAGE}" \
    certs --out /out --dns dds.dds-system.svc --dns dds.dds-system.svc.cluster.local --files-dir /config --force
  kube apply --filename "${ROOT}/manifests/dds/namespace.yaml"
  kube apply --filename "${WORKDIR}/tls/secrets.yaml"
}

deploy() {
  log "deploying DDS and cluster-autoscaler (manifests/overlays/kind)"
  # An overlay points the kustomization's placeholder image at the one just built and loaded.
  local name="${IMAGE%:*}" tag="${IMAGE##*:}"
  if [[ "${IMAGE##*/}" != *:* ]]; then
    name="${IMAGE}" tag="latest"
  fi
  # Under ROOT with a relative path: kustomize resolves resources relative to the overlay.
  local overlay="${ROOT}/.cache/kind-${CLUSTER}-overlay"
  mkdir -p "${overlay}"
  cat >"${overlay}/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../manifests/overlays/kind
images:
  - name: ghcr.io/dds-project/dds
    newName: ${name}
    newTag: "${tag}"
EOF
  kube apply --server-side --kustomize "${overlay}"
  kube -n dds-system rollout status deployment/cluster-autoscaler --timeout 180s
  # Only the leader becomes Ready (docs/operations.md "Leader election"): wait for one Ready replica, not two.
  local attempt
  for attempt in $(seq 1 60); do
    if [[ "$(kube -n dds-system get deployment dds -o jsonpath='{.status.readyReplicas}')" == "1" ]]; then
      return
    fi
    sleep 2
  done
  die "no DDS replica became Ready after ${attempt} tries: kubectl --context ${CONTEXT} -n dds-system logs deploy/dds"
}

# The demo MachineSet has one replica: the leading DDS (node_backend kwok) makes its Machine and kwok Node, then
# attaches the group's boot-time GPU from the simulated fabric.
demo_node_group() {
  log "creating the demo node group ${DEMO_NAMESPACE}/${DEMO_MACHINESET}"
  kube apply --kustomize "${ROOT}/manifests/examples"
  local attempt node=""
  for attempt in $(seq 1 90); do
    node="$(kube get nodes -l "cluster.x-k8s.io/set-name=${DEMO_MACHINESET}" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)"
    if [[ -n "${node}" && "$(kube get node "${node}" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" == "1" ]]; then
      DEMO_NODE="${node}"
      return
    fi
    sleep 2
  done
  die "the demo node group has no node with its boot-time GPU after ${attempt} tries: kubectl --context ${CONTEXT} -n dds-system logs deploy/dds"
}

print_next_steps() {
  cat <<EOF

DDS is running in kind cluster "${CLUSTER}" (context ${CONTEXT}).

The demo (case 1: CA asks for a node, DDS attaches a GPU instead):
  kubectl --context ${CONTEXT} apply -f ${ROOT}/manifests/examples/demo-pod.yaml
  kubectl --context ${CONTEXT} get pod gpu-demo --watch                 # Pending, then Running
  kubectl --context ${CONTEXT} describe pod gpu-demo                    # Events from cluster-autoscaler and dds
  kubectl --context ${CONTEXT} get node ${DEMO_NODE} -o jsonpath='{.status.allocatable.nvidia\.com/gpu}{"\n"}'

Look inside:
  kubectl --context ${CONTEXT} -n dds-system logs deploy/dds --follow
  kubectl --context ${CONTEXT} -n dds-system logs deploy/cluster-autoscaler --follow
  kubectl --context ${CONTEXT} -n dds-system get lease dds-leader      # which replica leads
  kubectl --context ${CONTEXT} -n dds-system port-forward svc/dds 8087  # then https://localhost:8087/metrics with a token: docs/operations.md "Metrics"

Adding a *node* (when GPUs alone cannot fit the pods) raises the MachineSet's replicas; the leading DDS turns them into
kwok nodes here (node_backend kwok), as a Cluster API infrastructure provider would in a real cluster.

Tear down: kind delete cluster --name ${CLUSTER}
mTLS material: ${WORKDIR}/tls (keys are 0600)
EOF
}

main() {
  require_tools
  create_cluster
  build_image
  install_crds
  install_kwok
  write_certs
  deploy
  demo_node_group
  print_next_steps
}

main "$@"
