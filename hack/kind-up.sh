#!/usr/bin/env bash
# DDS in a kind cluster, for machines WITH Docker (the test suite runs without Docker: see `make test`).
#
#   hack/kind-up.sh            # create (or reuse) kind cluster "dds" and deploy everything
#
# What it does, in order:
#   1. creates the kind cluster (reused when it exists)
#   2. builds the DDS image from ./Dockerfile and loads it into kind
#   3. installs Cluster API's own controllers at the pinned version (`clusterctl init`, which brings cert-manager)
#   4. installs the CDI operator's CRDs (manifests/crds/composability) and kwok (its controller and the "fast" stages)
#   5. writes mTLS material with `dds certs` (run from the image) and applies the two Secrets
#   6. applies manifests/overlays/kind (DDS x2 with leader election, node_backend machineset on the simulated fabric;
#      cluster-autoscaler with --cloud-provider=externalgrpc)
#   7. starts the harness's kwok infrastructure provider from this checkout (harness/kwok_provider.py, in the
#      background, log and pid under DDS_WORKDIR): it stands for the servers, as a cloud's provider would, and creates
#      the demo MachineSet (manifests/examples/) on kwok hosts; Cluster API makes its Machine, the provider its kwok
#      node, and DDS attaches the group's boot-time GPU
#   8. prints how to run the demo
#
# Needs docker, kind, kubectl and this checkout's Python (`make setup-python`); clusterctl is downloaded at the
# pinned version when it is not in PATH.
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
CLUSTERCTL_RELEASE="https://github.com/kubernetes-sigs/cluster-api/releases/download/${CLUSTER_API_VERSION}"
PYTHON="${ROOT}/.venv/bin/python"
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
  [[ -x "${PYTHON}" ]] || die "${PYTHON} is missing: run make setup-python first (the kwok provider runs from it)"
}

clusterctl_binary() {
  if command -v clusterctl >/dev/null 2>&1; then
    command -v clusterctl
    return
  fi
  local out="${WORKDIR}/bin/clusterctl-${CLUSTER_API_VERSION}"
  if [[ ! -x "${out}" ]]; then
    mkdir -p "${WORKDIR}/bin"
    local arch
    case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64|arm64) arch=arm64 ;; *) die "no clusterctl for $(uname -m)" ;; esac
    curl -fsSL --output "${out}.tmp" "${CLUSTERCTL_RELEASE}/clusterctl-$(uname -s | tr '[:upper:]' '[:lower:]')-${arch}"
    chmod +x "${out}.tmp" && mv "${out}.tmp" "${out}"
  fi
  echo "${out}"
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

install_cluster_api() {
  log "installing Cluster API ${CLUSTER_API_VERSION} (clusterctl init)"
  if ! kube get deployment -n capi-system capi-controller-manager >/dev/null 2>&1; then
    "$(clusterctl_binary)" init --kubeconfig-context "${CONTEXT}" --core "cluster-api:${CLUSTER_API_VERSION}" \
      --bootstrap "kubeadm:${CLUSTER_API_VERSION}" --control-plane "kubeadm:${CLUSTER_API_VERSION}" --wait-providers
  fi
  kube -n capi-system rollout status deployment/capi-controller-manager --timeout 300s
}

install_crds() {
  log "installing the CDI operator's CRDs from manifests/crds/composability"
  kube apply --server-side --recursive --filename "${ROOT}/manifests/crds/composability"
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

# The kwok infrastructure provider stands for the servers: started from this checkout with an admin token, it creates
# the demo MachineSet (one replica) on kwok hosts; Cluster API makes its Machine, the provider its kwok node, and the
# leading DDS attaches the group's boot-time GPU from the simulated fabric.
demo_node_group() {
  log "starting the kwok infrastructure provider and the demo node group ${DEMO_NAMESPACE}/${DEMO_MACHINESET}"
  kube -n kube-system create serviceaccount kwok-provider --dry-run=client -o yaml | kube apply -f -
  kube create clusterrolebinding kwok-provider --clusterrole cluster-admin \
    --serviceaccount kube-system:kwok-provider --dry-run=client -o yaml | kube apply -f -
  kube -n kube-system create token kwok-provider --duration 720h >"${WORKDIR}/kwok-provider.token"
  chmod 600 "${WORKDIR}/kwok-provider.token"
  kind get kubeconfig --name "${CLUSTER}" >"${WORKDIR}/kubeconfig"
  chmod 600 "${WORKDIR}/kubeconfig"
  if [[ -f "${WORKDIR}/kwok-provider.pid" ]]; then
    kill "$(cat "${WORKDIR}/kwok-provider.pid")" 2>/dev/null || true
  fi
  (cd "${ROOT}" && nohup "${PYTHON}" -m harness.kwok_provider --kubeconfig "${WORKDIR}/kubeconfig" \
    --token-file "${WORKDIR}/kwok-provider.token" \
    --machineset "${ROOT}/manifests/examples/machineset-gpu-workers.yaml" \
    >"${WORKDIR}/kwok-provider.log" 2>&1 & echo $! >"${WORKDIR}/kwok-provider.pid")
  local attempt node=""
  for attempt in $(seq 1 90); do
    # The group's hosts carry DDS's group label (Cluster API copies no Machine label such as set-name to its Node).
    node="$(kube get nodes -l "dds.cdi.dev/node-group=MachineSet.${DEMO_NAMESPACE}.${DEMO_MACHINESET}" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)"
    if [[ -n "${node}" && "$(kube get node "${node}" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" == "1" ]]; then
      DEMO_NODE="${node}"
      return
    fi
    sleep 2
  done
  die "the demo node group has no node with its boot-time GPU after ${attempt} tries: ${WORKDIR}/kwok-provider.log, kubectl --context ${CONTEXT} -n dds-system logs deploy/dds"
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

Adding a *node* (when GPUs alone cannot fit the pods) raises the MachineSet's replicas; Cluster API makes the Machines
and the kwok provider (pid in ${WORKDIR}/kwok-provider.pid, log beside it) their kwok nodes, as a cloud's infrastructure
provider would in a real cluster.

Tear down: kill \$(cat ${WORKDIR}/kwok-provider.pid); kind delete cluster --name ${CLUSTER}
mTLS material: ${WORKDIR}/tls (keys are 0600)
EOF
}

main() {
  require_tools
  create_cluster
  build_image
  install_cluster_api
  install_crds
  install_kwok
  write_certs
  deploy
  demo_node_group
  print_next_steps
}

main "$@"
