#!/usr/bin/env bash
# Build the loopback test cluster's binaries from pinned Go modules (versions.env): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok; the real node's kubelet,
# kube-proxy and containerd (containerd, its runc shim, ctr); KEDA's HTTP add-on interceptor (the e2e's
# held request, bin/interceptor-<version>); the LeaderWorkerSet controller (bin/lws-controller-<version>); and
# fetch the CRD YAML (KEDA, its HTTP add-on, Prometheus Operator, Gateway API, LeaderWorkerSet) and kwok's Stage
# YAML. Everything lands in
#   $GS_CACHE/cluster/<versions-key>/{bin,crds,stages}
# and a warm cache makes this a few seconds of checks. Cold build seconds per component are written
# to build-times.txt in that folder. Prints the folder on stdout.
#
#   testbed/cluster/build.sh            build what is missing
#   testbed/cluster/build.sh --print    print the folder, build nothing (exit 1 if incomplete)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/versions.env"

BUILD_NAME="cluster build"
# shellcheck source=testbed/lib.sh
source "$here/../lib.sh"

need_go "the cluster"
go_version=$(go env GOVERSION)
key="k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-containerd-$CONTAINERD_VERSION-$go_version"
out="$GS_CACHE/cluster/$key"
bin="$out/bin"
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kubelet kube-proxy containerd)
# Named by its pin, which the folder's key leaves out: a new pin builds it alone.
interceptor="interceptor-$HTTP_ADD_ON_VERSION"
lws="lws-controller-$LWS_VERSION"
crd_files=(
	"keda-$KEDA_VERSION/keda.sh_scaledobjects.yaml"
	"http-add-on-$HTTP_ADD_ON_VERSION/http.keda.sh_httpscaledobjects.yaml"
	"http-add-on-$HTTP_ADD_ON_VERSION/http.keda.sh_interceptorroutes.yaml"
	"prometheus-operator-$PROMETHEUS_OPERATOR_VERSION/monitoring.coreos.com_servicemonitors.yaml"
	"prometheus-operator-$PROMETHEUS_OPERATOR_VERSION/monitoring.coreos.com_podmonitors.yaml"
	"prometheus-operator-$PROMETHEUS_OPERATOR_VERSION/monitoring.coreos.com_prometheusrules.yaml"
	"gateway-api-$GATEWAY_API_VERSION/.complete"
	"$ENDPOINT_CRDS/.complete"
	"lws-$LWS_VERSION/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
	"lws-$LWS_VERSION/disaggregatedset.x-k8s.io_disaggregatedsets.yaml"
)
stage_files=(node-initialize.yaml node-heartbeat-with-lease.yaml pod-ready.yaml pod-complete.yaml pod-delete.yaml)

stages_ok() {
	local f
	for f in "${stage_files[@]}"; do [[ -s $out/stages/$f ]] || return 1; done
}
complete() {
	local c f
	for c in "${components[@]}" containerd-shim-runc-v2 ctr "$interceptor" "$lws"; do [[ -x $bin/$c ]] || return 1; done
	for f in "${crd_files[@]}"; do [[ -s $out/crds/$f || -e $out/crds/$f ]] || return 1; done
	stages_ok
}

if [[ ${1:-} == --print ]]; then
	complete || { echo "$out"; exit 1; }
	echo "$out"
	exit 0
fi
if complete; then
	log "cached: $out"
	echo "$out"
	exit 0
fi

mkdir -p "$bin" "$out/src" "$out/crds" "$out/stages"
times="$out/build-times.txt"
[[ -f $times ]] || printf '# component cold-build-seconds (%s, %s cores)\n' "$go_version" "$(nproc)" >"$times"

# module_time MODULE@VERSION: the release time the proxy gives (its .info; this proxy gives no commit).
module_time() {
	local info
	info=$(go mod download -json "$1" | sed -n 's/^\t"Info": "\(.*\)",$/\1/p')
	sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info"
}

# timed NAME COMMAND...: run COMMAND, record its seconds for NAME in build-times.txt.
timed() {
	local name=$1 start end
	shift
	start=$(date +%s)
	"$@"
	end=$(date +%s)
	sed -i "/^$name /d" "$times"
	echo "$name $((end - start))" >>"$times"
	log "$name built in $((end - start))s"
}

# ---- etcd: the module root is the main package; its go.mod replaces its sibling modules with ../
# paths, which a wrapper module points at the published versions of the same release.
wrapper_etcd() {
	local m replaces=()
	for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do replaces+=("go.etcd.io/etcd/$m=go.etcd.io/etcd/$m@$ETCD_VERSION"); done
	wrapper "$out/src/etcd" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "${replaces[@]}"
}
build_etcd() {
	wrapper_etcd
	(cd "$out/src/etcd" && go build -mod=mod -trimpath -o "$bin/etcd.tmp" -ldflags "-s -w" go.etcd.io/etcd/server/v3)
	mv "$bin/etcd.tmp" "$bin/etcd"
}

# ---- Kubernetes: k8s.io/kubernetes requires its ~30 staging modules at v0.0.0 and replaces them with
# ./staging/... paths; the wrapper replaces each by the published v0.<minor>.<patch>.
wrapper_kube() {
	local w="$out/src/kubernetes"
	[[ -s $w/go.sum ]] && return 0
	local staging
	module_dir "k8s.io/kubernetes@$KUBERNETES_VERSION" >/dev/null
	local modfile="$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.mod"
	[[ -s $modfile ]] || die "no go.mod for k8s.io/kubernetes@$KUBERNETES_VERSION in $GOMODCACHE"
	# staging modules: the ones the release requires at v0.0.0 and replaces with a ./staging path
	staging=$(go mod edit -json "$modfile" | python3 -c '
import json, sys
d = json.load(sys.stdin)
req = {r["Path"]: r["Version"] for r in d.get("Require") or []}
for r in d.get("Replace") or []:
    old, new = r["Old"]["Path"], r["New"]["Path"]
    if new.startswith("./staging/") and req.get(old) == "v0.0.0":
        print(old)
')
	[[ -n $staging ]] || die "found no staging modules in $modfile"
	local v=${KUBERNETES_VERSION#v} m replaces=()
	local staging_version="v0.${v#*.}"
	for m in $staging; do replaces+=("$m=$m@$staging_version"); done
	log "kubernetes wrapper: $(wc -w <<<"$staging") staging modules at $staging_version"
	wrapper "$w" "k8s.io/kubernetes@$KUBERNETES_VERSION" "${replaces[@]}"
	(
		cd "$w"
		go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" \
			"k8s.io/kubernetes/cmd/kube-controller-manager@$KUBERNETES_VERSION" \
			"k8s.io/kubernetes/cmd/kube-scheduler@$KUBERNETES_VERSION" \
			"k8s.io/kubernetes/cmd/kubectl@$KUBERNETES_VERSION" \
			"k8s.io/kubernetes/cmd/kubelet@$KUBERNETES_VERSION" \
			"k8s.io/kubernetes/cmd/kube-proxy@$KUBERNETES_VERSION"
	) >&2
}
kube_ldflags() {
	local v=${KUBERNETES_VERSION#v} date pkg flags="-s -w"
	date=$(module_time "k8s.io/kubernetes@$KUBERNETES_VERSION")
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=${v%%.*}"
		flags+=" -X $pkg.gitMinor=$(cut -d. -f2 <<<"$v")"
		flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
	done
	echo "$flags"
}
# build_kube NAME...: one `go build` for all of them. One after the other, each build loaded and
# hashed the whole package graph again and linked with nothing else to do; in one build the graph
# is loaded once and each binary links while the packages of the others still compile.
build_kube() {
	local name pkgs=() tmp="$out/src/kubernetes/bin"
	wrapper_kube
	for name in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
	rm -rf "$tmp" && mkdir -p "$tmp"
	(cd "$out/src/kubernetes" && go build -mod=mod -trimpath -o bin/ -ldflags "$(kube_ldflags)" "${pkgs[@]}")
	for name in "$@"; do mv "$tmp/$name" "$bin/$name"; done
}

# ---- kwok: no replaces, but built in a wrapper as well so its dependency versions stay its own.
wrapper_kwok() { wrapper "$out/src/kwok" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"; }
build_kwok() {
	wrapper_kwok
	(cd "$out/src/kwok" && go build -mod=mod -trimpath -o "$bin/kwok.tmp" \
		-ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" sigs.k8s.io/kwok/cmd/kwok)
	mv "$bin/kwok.tmp" "$bin/kwok"
}

# ---- containerd: the daemon, its runc shim and ctr from one module, in a wrapper of their own. The
# version string is what the node steps parse (80-runtime.sh reads `containerd --version`).
wrapper_containerd() { wrapper "$out/src/containerd" "github.com/containerd/containerd/v2@$CONTAINERD_VERSION"; }
build_containerd() {
	local m=github.com/containerd/containerd/v2
	wrapper_containerd
	mkdir -p "$out/src/containerd/bin"
	(cd "$out/src/containerd" && go build -mod=mod -trimpath -o bin/ -ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION" \
		"$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr")
	mv "$out/src/containerd/bin/"* "$bin/"
}

# ---- KEDA's HTTP add-on interceptor: its main package in the add-on's module, in a wrapper of its own (no replaces;
# the proxy refuses the module's version list, which `go install pkg@version` asks for).
build_interceptor() {
	wrapper "$out/src/http-add-on" "github.com/kedacore/http-add-on/interceptor@$HTTP_ADD_ON_VERSION"
	(cd "$out/src/http-add-on" && go build -mod=mod -trimpath -o "$bin/$interceptor.tmp" -ldflags "-s -w" \
		github.com/kedacore/http-add-on/interceptor)
	mv "$bin/$interceptor.tmp" "$bin/$interceptor"
}

# ---- LeaderWorkerSet: controllers and webhooks in one main package (cmd/), in a wrapper of its own (no replaces). The
# proxy gives no commit, and the default GitCommit is a made-up hash, so it says unknown instead.
build_lws() {
	local v=sigs.k8s.io/lws/pkg/version date
	wrapper "$out/src/lws" "sigs.k8s.io/lws@$LWS_VERSION"
	date=$(module_time "sigs.k8s.io/lws@$LWS_VERSION")
	(cd "$out/src/lws" && go build -mod=mod -trimpath -o "$bin/$lws.tmp" \
		-ldflags "-s -w -X $v.GitVersion=$LWS_VERSION -X $v.BuildDate=$date -X $v.GitCommit=unknown" sigs.k8s.io/lws/cmd)
	mv "$bin/$lws.tmp" "$bin/$lws"
}

kube=()
for c in "${components[@]}"; do
	[[ -x $bin/$c ]] && continue
	case $c in
	etcd | kwok | containerd)
		log "building $c (cold builds take minutes; log of go on stderr)"
		timed "$c" "build_$c"
		;;
	*) kube+=("$c") ;;
	esac
done
if ((${#kube[@]})); then
	names=$(IFS=+; echo "${kube[*]}")
	log "building $names in one go build (cold, many minutes; log of go on stderr)"
	timed "$names" build_kube "${kube[@]}"
fi
if [[ ! -x $bin/$interceptor ]]; then
	log "building $interceptor"
	timed interceptor build_interceptor
fi
if [[ ! -x $bin/$lws ]]; then
	log "building $lws (cold, a few minutes)"
	timed lws-controller build_lws
fi

# ---- CRDs and Stage YAML, copied out of the pinned module zips.
copy_files() { # SRC_DIR DEST_DIR FILE...
	local src=$1 dest=$2 f
	shift 2
	mkdir -p "$dest"
	for f in "$@"; do
		[[ -s $src/$f ]] || die "$src has no $f"
		install -m 0644 "$src/$f" "$dest/$(basename "$f")"
	done
}

keda_dir="$out/crds/keda-$KEDA_VERSION"
if [[ ! -s $keda_dir/keda.sh_scaledobjects.yaml ]]; then
	copy_files "$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")" "$keda_dir" \
		config/crd/bases/keda.sh_scaledobjects.yaml
fi
http_dir="$out/crds/http-add-on-$HTTP_ADD_ON_VERSION"
if [[ ! -s $http_dir/http.keda.sh_interceptorroutes.yaml ]]; then
	copy_files "$(module_dir "github.com/kedacore/http-add-on@$HTTP_ADD_ON_VERSION")" "$http_dir" \
		config/crd/bases/http.keda.sh_httpscaledobjects.yaml config/crd/bases/http.keda.sh_interceptorroutes.yaml
fi
prom_dir="$out/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
if [[ ! -s $prom_dir/monitoring.coreos.com_prometheusrules.yaml ]]; then
	src=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
	copy_files "$src" "$prom_dir" \
		example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml \
		example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml \
		example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml
fi
gw_dir="$out/crds/gateway-api-$GATEWAY_API_VERSION"
if [[ ! -e $gw_dir/.complete ]]; then
	src=$(module_dir "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION")
	mapfile -t gw_files < <(cd "$src" && ls config/crd/standard/*.yaml)
	[[ ${#gw_files[@]} -gt 0 ]] || die "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION has no config/crd/standard/*.yaml"
	copy_files "$src" "$gw_dir" "${gw_files[@]}"
	touch "$gw_dir/.complete"
fi

# Only the base CRDs: the kustomize patch adds a conversion webhook, and v1 is the only version there is to convert.
lws_dir="$out/crds/lws-$LWS_VERSION"
if [[ ! -s $lws_dir/disaggregatedset.x-k8s.io_disaggregatedsets.yaml ]]; then
	copy_files "$(module_dir "sigs.k8s.io/lws@$LWS_VERSION")" "$lws_dir" \
		config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml \
		config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml
fi

ep_dir="$out/crds/$ENDPOINT_CRDS"
if [[ ! -e $ep_dir/.complete ]]; then
	endpoint_crds "$ep_dir"
	touch "$ep_dir/.complete"
fi

# kwok's own Stage YAML: node/fast (Ready at once), node/heartbeat-with-lease (keeps Ready with a
# node lease, as kwokctl does), pod/fast (Running+Ready at once; Job pods Succeeded; deletion).
if ! stages_ok; then
	src=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize/stage
	copy_files "$src" "$out/stages" node/fast/node-initialize.yaml \
		node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
		pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml
fi

complete || die "incomplete after build: $out"
"$bin/kube-apiserver" --version >&2
log "done: $out"
echo "$out"
