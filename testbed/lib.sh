# shellcheck shell=bash
# The preamble the three Go builds share (engine/, cluster/, checkers/), sourced after setting
# BUILD_NAME. One module cache and one build cache for all three: a package they have in common
# (client-go, grpc, protobuf, ...) is downloaded and compiled once.

: "${GS_CACHE:=$HOME/.cache/gpu-serving}"
export GS_CACHE GOMODCACHE="$GS_CACHE/go/mod" GOCACHE="$GS_CACHE/go/build" GOFLAGS=-buildvcs=false
export CGO_ENABLED=0 GOTOOLCHAIN=local GO111MODULE=on

log() { printf '== %s: %s\n' "$BUILD_NAME" "$*" >&2; }
die() { printf '%s: %s\n' "$BUILD_NAME" "$*" >&2; exit 1; }

# need_go WHAT: stop with one line when there is no Go toolchain.
need_go() { command -v go >/dev/null || die "go is not installed (Go >= 1.26 builds $1)"; }

# module_dir MODULE@VERSION: download it (the zip holds the repository's files at that version)
# and print its read-only folder in the module cache.
module_dir() {
	local json
	json=$(go mod download -json "$1") || die "go mod download $1 failed: $json"
	grep -q '"Error"' <<<"$json" && die "$1 is not served: $(grep '"Error"' <<<"$json")"
	sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$json"
}

# endpoint_crds DEST: the CRDs of the teams' endpoint (testbed/cluster/versions.env) into DEST, for the loopback
# cluster and the schema checks alike. Envoy Gateway keeps its CRDs in a Helm chart: its `{{ }}` guard lines go.
endpoint_crds() {
	local dest=$1 src f
	mkdir -p "$dest"
	src=$(module_dir "sigs.k8s.io/gateway-api-inference-extension@$INFERENCE_EXTENSION_VERSION")/config/crd/bases
	install -m 0644 "$src/inference.networking.k8s.io_inferencepools.yaml" \
		"$src/inference.networking.x-k8s.io_inferenceobjectives.yaml" \
		"$src/inference.networking.x-k8s.io_inferencemodelrewrites.yaml" "$dest/"
	src=$(module_dir "github.com/envoyproxy/ai-gateway@$AI_GATEWAY_VERSION")/manifests/charts/ai-gateway-crds-helm/templates
	install -m 0644 "$src/aigateway.envoyproxy.io_aigatewayroutes.yaml" "$src/aigateway.envoyproxy.io_aiservicebackends.yaml" \
		"$src/aigateway.envoyproxy.io_backendsecuritypolicies.yaml" "$dest/"
	src=$(module_dir "github.com/envoyproxy/gateway@$ENVOY_GATEWAY_VERSION")/charts/gateway-crds-helm/templates/generated
	for f in securitypolicies backendtrafficpolicies backends; do
		grep -v '^{{' "$src/gateway.envoyproxy.io_$f.yaml" >"$dest/gateway.envoyproxy.io_$f.yaml"
	done
}

# wrapper DIR MODULE@VERSION [OLD=NEW@VERSION...]: a module that requires MODULE, so a main package
# of a module with relative replace lines builds with published versions in their place. Kept (and
# reused) once its go.sum exists.
wrapper() {
	local dir=$1 require=$2
	shift 2
	[[ -s $dir/go.sum ]] && return 0
	rm -rf "$dir" && mkdir -p "$dir"
	(
		cd "$dir" || exit 1
		go mod init wrapper >/dev/null 2>&1
		local r
		for r in "$@"; do go mod edit -replace "$r"; done
		go get "$require"
	) >&2
}
