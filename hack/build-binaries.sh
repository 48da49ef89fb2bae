#!/usr/bin/env bash
# Builds (once) and caches the pinned binaries the tests and `make demo` run as local processes: etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager (DRA tests only), kwok, the real cluster-autoscaler, the
# CDI operator `cro-manager` (composability tests only), Cluster API's core manager `cluster-api-manager` and Kueue's
# manager `kueue` (tests/e2e/test_kueue.py only). Prints the bin directory on its last line.
#
#   bash hack/build-binaries.sh            the profile $DDS_K8S_PROFILE, else hack/versions.env's default profile
#   bash hack/build-binaries.sh 1.35       that Kubernetes profile (hack/versions-1.35.env)
#   bash hack/build-binaries.sh --all      every profile (hack/setup.sh); prints the default profile's directory
#
# DDS_BINARIES=demo builds only what `make demo` runs (etcd, kwok, kube-apiserver, kube-scheduler, cluster-autoscaler,
# cluster-api-manager); the default, all, adds kube-controller-manager, cro-manager and kueue (make test).
#
# Independent builds run at once, up to DDS_BUILD_JOBS (default 3) at a time, longest first: one downloads modules
# while another compiles, and a Kubernetes link takes about 2 GiB. Each Kubernetes profile's binaries come from one
# wrapper module (one module download for all of them); Go's build cache ($(go env GOCACHE)) is shared by every build
# and every profile.
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
binaries="${DDS_BINARIES:-all}"
[[ "$binaries" == all || "$binaries" == demo ]] || die "DDS_BINARIES must be all or demo (it is '$binaries')"
build_jobs="${DDS_BUILD_JOBS:-3}"
[[ "$build_jobs" =~ ^[1-9][0-9]*$ ]] || die "DDS_BUILD_JOBS must be a positive number (it is '$build_jobs')"

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

# building NAME [WHAT]: the one progress line a build prints, and a fresh log. NAME carries the version where two
# profiles build the same program at once (each its own log).
building() {
  : >"$logs/$1.log"
  log "building $1${2:+ $2} (log: $logs/$1.log)"
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

# The profile's Kubernetes binaries: kube-apiserver and kube-scheduler, and (DDS_BINARIES=all) kube-controller-manager,
# which runs only its resourceclaim controller in the harness (ResourceClaims from templates, claims released when
# their pods end: docs/dra.md). One wrapper module requires all three, so their modules are resolved and downloaded
# once; one `go build` compiles what is missing (the packages they share once). The wrapper is kept, so a demo cache
# that later needs kube-controller-manager builds only that binary.
build_kubernetes() {
  local out="$cache/kubernetes-$KUBERNETES_VERSION" wanted=(kube-apiserver kube-scheduler) missing=() cmd
  [[ "$binaries" == all ]] && wanted+=(kube-controller-manager)
  # A cache of the earlier layout keeps kube-controller-manager in a folder of its own: adopted, not rebuilt.
  local earlier="$cache/kube-controller-manager-$KUBERNETES_VERSION/kube-controller-manager"
  if [[ -x "$earlier" && -d "$out" && ! -e "$out/kube-controller-manager" ]]; then
    ln -s "$earlier" "$out/kube-controller-manager"
  fi
  for cmd in "${wanted[@]}"; do [[ -x "$out/$cmd" ]] || missing+=("$cmd"); done
  (( ${#missing[@]} )) || return 0
  local name="kubernetes-$KUBERNETES_VERSION"
  building "$name" "(${missing[*]})"
  local w="$cache/wrappers/kubernetes-$KUBERNETES_VERSION"
  if [[ ! -f "$w/.complete" ]]; then
    rm -rf "$w"; mkdir -p "$w"; cd "$w"
    run "$name" go mod init dds.local/wrapper/kubernetes
    run "$name" go mod edit -go="$KUBERNETES_GO_DIRECTIVE" -godebug="default=$KUBERNETES_GODEBUG"
    replace_staging_modules "$name"
    run "$name" go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$KUBERNETES_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBERNETES_VERSION"
    touch "$w/.complete"
  fi
  cd "$w"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp" "$out"
  run "$name" go build -trimpath -ldflags "$(k8s_ldflags "$KUBERNETES_VERSION")" -o "$out.tmp/" \
    "${missing[@]/#/k8s.io/kubernetes/cmd/}"
  # Each binary moved in whole: a test resolving one meanwhile sees none or all of it.
  for cmd in "${missing[@]}"; do mv -f "$out.tmp/$cmd" "$out/$cmd"; done
  rm -rf "$out.tmp"
  built "$name"
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
  local name="cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION"
  building "$name"
  mkdir -p "$out.tmp"
  (cd "$dir" && run "$name" go build -trimpath -tags externalgrpc -ldflags "-s -w" \
    -o "$out.tmp/cluster-autoscaler" .)
  rm -rf "$out" "$w"; mv "$out.tmp" "$out"
  built "$name"
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

# module_dir NAME MODULE@VERSION SUM: downloads a module from the module proxy and prints its (read-only) directory in
# the module cache, after checking that its go.sum hash is SUM (hack/versions.env): another download is an error.
module_dir() {
  local name="$1" module="$2" want="$3" answer got dir
  answer="$(go mod download -json "$module" 2>>"$logs/$name.log")" ||
    { tail -n 25 "$logs/$name.log" >&2; die "cannot download $module from the module proxy"; }
  got="$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p' <<<"$answer")"
  dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$answer")"
  [[ "$got" == "$want" ]] || die "$module from the module proxy has go.sum hash '$got', expected $want (hack/versions.env)"
  [[ -d "$dir" ]] || die "$module: no module directory from the module proxy ($dir)"
  echo "$dir"
}

# Cluster API's core manager (core/main.go since v1.14) and the install files of the same release under config/: its
# CRDs with their conversion patches (core/config/crd), webhook configuration, RBAC and the role aggregation of
# config/default (harness/capi.py installs them as shipped). The api
# module is nested (go.mod: replace sigs.k8s.io/cluster-api/api => ./api) and not in the first module's zip.
build_cluster_api() {
  local out="$cache/cluster-api-$CLUSTER_API_VERSION"
  if [[ -x "$out/cluster-api-manager" && -f "$out/config/webhook/manifests.yaml" ]]; then return; fi
  building cluster-api "$CLUSTER_API_VERSION"
  local w="$cache/wrappers/cluster-api-$CLUSTER_API_VERSION" core api
  core="$(module_dir cluster-api "sigs.k8s.io/cluster-api@$CLUSTER_API_VERSION" "$CLUSTER_API_MODULE_SUM")"
  api="$(module_dir cluster-api "sigs.k8s.io/cluster-api/api@$CLUSTER_API_VERSION" "$CLUSTER_API_API_MODULE_SUM")"
  rm -rf "$w" "$out.tmp"; mkdir -p "$(dirname "$w")" "$out.tmp/config/rbac" "$out.tmp/config/webhook" \
    "$out.tmp/config/default"
  cp -r "$core" "$w" && chmod -R u+w "$w" && rm -rf "$w/api" && cp -r "$api" "$w/api" && chmod -R u+w "$w/api" ||
    die "cannot copy the Cluster API modules into $w"
  (cd "$w" && run cluster-api go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$CLUSTER_API_VERSION" \
    -o "$out.tmp/cluster-api-manager" ./core)
  cp -r "$w/core/config/crd" "$out.tmp/config/crd"
  cp "$w"/core/config/rbac/*.yaml "$out.tmp/config/rbac/"
  cp "$w/core/config/webhook/manifests.yaml" "$out.tmp/config/webhook/"
  cp "$w"/core/config/default/{kustomization.yaml,manager_role_aggregation_patch.yaml} "$out.tmp/config/default/"
  rm -rf "$out" "$w"; mv "$out.tmp" "$out"
  built cluster-api
}

# Kueue's manager (cmd/kueue) from its Go module, pinned by go.sum hash, in a wrapper module that requires only it (so
# the versions are those of Kueue's own go.mod, which replaces nothing), and the install files of the same release
# under config/ (harness/kueue.py installs them as shipped): its CRDs with the conversion-webhook patches
# (config/components/crd), RBAC (config/components/rbac), webhook configuration (config/components/webhook) and the
# Secret its internal certificate management fills (config/components/internalcert). Shared by every profile and not
# linked into a profile's bin dir: harness/kueue.py finds it as <cache>/kueue-<KUEUE_VERSION>/kueue.
build_kueue() {
  local out="$cache/kueue-$KUEUE_VERSION"
  if [[ -x "$out/kueue" && -f "$out/config/webhook/manifests.yaml" ]]; then return; fi
  building kueue "$KUEUE_VERSION"
  local w="$cache/wrappers/kueue-$KUEUE_VERSION" module part
  module="$(module_dir kueue "sigs.k8s.io/kueue@$KUEUE_VERSION" "$KUEUE_MODULE_SUM")"
  rm -rf "$w" "$out.tmp"; mkdir -p "$w" "$out.tmp/config"
  (cd "$w" && run kueue go mod init dds.local/wrapper/kueue &&
    run kueue go get -tool "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" &&
    run kueue go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
      -o "$out.tmp/kueue" sigs.k8s.io/kueue/cmd/kueue)
  for part in crd rbac webhook internalcert; do
    cp -r "$module/config/components/$part" "$out.tmp/config/$part" || die "cannot copy Kueue's config/components/$part"
  done
  chmod -R u+w "$out.tmp/config"
  rm -rf "$out" "$w"; mv "$out.tmp" "$out"
  built kueue
}

# link_profile PROFILE DIR: DIR becomes a directory of symlinks to that profile's binaries (the harness's bin dir).
link_profile() {
  local bin="$2"
  rm -rf "$bin.tmp"; mkdir -p "$bin.tmp"
  ln -sf "$cache/etcd-$ETCD_VERSION/etcd" "$bin.tmp/etcd"
  ln -sf "$cache/kwok-$KWOK_VERSION/kwok" "$bin.tmp/kwok"
  ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-apiserver" "$bin.tmp/kube-apiserver"
  ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-scheduler" "$bin.tmp/kube-scheduler"
  ln -sf "$cache/kubernetes-$KUBERNETES_VERSION/kube-controller-manager" "$bin.tmp/kube-controller-manager"
  ln -sf "$cache/cluster-autoscaler-$CLUSTER_AUTOSCALER_VERSION/cluster-autoscaler" "$bin.tmp/cluster-autoscaler"
  ln -sf "$cache/cro-manager-${CRO_COMMIT:0:7}/cro-manager" "$bin.tmp/cro-manager"
  ln -sf "$cache/cluster-api-$CLUSTER_API_VERSION/cluster-api-manager" "$bin.tmp/cluster-api-manager"
  echo "profile=$1 kubernetes=$KUBERNETES_VERSION cluster-autoscaler=$CLUSTER_AUTOSCALER_VERSION cluster-api=$CLUSTER_API_VERSION" >"$bin.tmp/PROFILE"
  # Swapped in whole, so a test resolving the directory meanwhile sees the old set or the new one, never half of one.
  rm -rf "$bin.old"; [[ -e "$bin" ]] && mv "$bin" "$bin.old"
  mv "$bin.tmp" "$bin"; rm -rf "$bin.old"
}

# start NAME FUNCTION: runs one build in the background, once fewer than DDS_BUILD_JOBS are running.
pids=() names=()
start() {
  while (( $(jobs -rp | wc -l) >= build_jobs )); do wait -n || true; done
  ( "$2" ) &
  pids+=($!) names+=("$1")
}

# finish: waits for every build started; an error names each that failed (its log tail was shown above).
finish() {
  local i failed=()
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed+=("${names[$i]}"); done
  (( ${#failed[@]} == 0 )) || die "these builds failed: ${failed[*]} (logs under $logs)"
}

# link PROFILE: links that profile's bin dir (and $cache/current for the default profile); prints nothing.
link() {
  load_profile "$1"
  local bin="$cache/k8s-$1"
  # A warm run relinks nothing: tests of another profile may be reading the directories right now.
  [[ "$(cat "$bin/PROFILE" 2>/dev/null)" == "profile=$1 kubernetes=$KUBERNETES_VERSION cluster-autoscaler=$CLUSTER_AUTOSCALER_VERSION cluster-api=$CLUSTER_API_VERSION" ]] ||
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
began=$(date +%s)
# Longest first (the Kubernetes builds take minutes each), the shared binaries last.
for profile in "${wanted[@]}"; do load_profile "$profile"; start "kubernetes $KUBERNETES_VERSION" build_kubernetes; done
for profile in "${wanted[@]}"; do
  load_profile "$profile"; start "cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION" build_cluster_autoscaler
done
[[ "$binaries" == all ]] && start cro-manager build_cro_manager
start cluster-api build_cluster_api
[[ "$binaries" == all ]] && start kueue build_kueue
start etcd build_etcd
start kwok build_kwok
finish
for profile in "${wanted[@]}"; do link "$profile"; done
elapsed=$(( $(date +%s) - began ))
(( elapsed > 1 )) && log "binaries ready in $elapsed s: $cache/k8s-$selected (profile $selected)"
echo "$cache/k8s-$selected"
