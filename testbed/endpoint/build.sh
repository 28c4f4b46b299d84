#!/usr/bin/env bash
# Build the picker proof's Go binaries from pinned modules (testbed/cluster/versions.env):
#   epp                  the endpoint picker, sigs.k8s.io/gateway-api-inference-extension cmd/epp
#   llm-d-inference-sim  llm-d's vLLM simulator, github.com/llm-d/llm-d-inference-sim cmd/llm-d-inference-sim
#   extproc-client       testbed/endpoint/extproc_client: plays Envoy's side of the ext_proc stream, and
#                        with -serve the gateway's data plane (a stand-in: none can be built here)
# (The CRDs come from the cluster build: cluster.sh serves them from the start.)
# One wrapper module requires both upstream modules and holds the client, and one `go build` makes
# all three, so what they share (client-go, controller-runtime, grpc, protobuf, prometheus) is
# resolved to one version each and compiled once. The cost: each upstream main is built against
# that one graph (the higher of the two pins, e.g. grpc v1.81.1 where the EPP pins v1.80.0), not
# against its own go.sum alone.
# Everything lands in $GS_CACHE/endpoint/<versions-key>/bin; a warm cache is a few file checks.
# Cold build seconds go to build-times.txt there. Prints the bin folder on stdout.
#
#   testbed/endpoint/build.sh            build what is missing
#   testbed/endpoint/build.sh --print    print the folder, build nothing (exit 1 if incomplete)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/../cluster/versions.env"

BUILD_NAME="endpoint build"
# shellcheck source=testbed/lib.sh
source "$here/../lib.sh"

need_go "the endpoint picker"
go_version=$(go env GOVERSION)
gaie=sigs.k8s.io/gateway-api-inference-extension
sim=github.com/llm-d/llm-d-inference-sim
client_src="$here/extproc_client"
client_sum=$(cat "$client_src"/*.go | sha256sum | cut -c1-12)
key="gaie-$INFERENCE_EXTENSION_VERSION-sim-$INFERENCE_SIM_VERSION-$go_version"
out="$GS_CACHE/endpoint/$key"
bin="$out/bin"
# The client is keyed by its source too: an edit rebuilds it alone, against the warm build cache.
client_bin="$bin/extproc-client-$client_sum"

complete() { [[ -x $bin/epp && -x $bin/llm-d-inference-sim && -x $client_bin ]]; }

if [[ ${1:-} == --print ]]; then
	complete || { echo "$bin"; exit 1; }
	echo "$bin"
	exit 0
fi
if complete; then
	log "cached: $out"
	echo "$bin"
	exit 0
fi

mkdir -p "$bin"
times="$out/build-times.txt"
[[ -f $times ]] || printf '# step seconds (%s, %s cores)\n' "$go_version" "$(nproc)" >"$times"
record() { sed -i "/^$1 /d" "$times" && echo "$1 $2" >>"$times" && log "$1 in $2s"; }

src="$out/src"
start=$SECONDS
wrapper "$src" "$gaie/cmd/epp@$INFERENCE_EXTENSION_VERSION"
grep -q "^	$sim " "$src/go.mod" || (cd "$src" && go get "$sim/cmd/llm-d-inference-sim@$INFERENCE_SIM_VERSION") >&2
record modules $((SECONDS - start))

mkdir -p "$src/extprocclient" "$src/bin"
rm -f "$src/extprocclient"/*.go
install -m 0644 "$client_src"/*.go "$src/extprocclient/"
# The EPP logs this at start and exports it as a metric label; its release images stamp it the same way.
ldflags="-s -w -X $gaie/version.BuildRef=$INFERENCE_EXTENSION_VERSION"
targets=(./extprocclient)
[[ -x $bin/epp ]] || targets+=("$gaie/cmd/epp")
[[ -x $bin/llm-d-inference-sim ]] || targets+=("$sim/cmd/llm-d-inference-sim")
log "building ${targets[*]} (a cold build takes minutes)"
start=$SECONDS
(cd "$src" && go build -mod=mod -trimpath -ldflags "$ldflags" -o bin/ "${targets[@]}")
record "build-${#targets[@]}" $((SECONDS - start))
for b in epp llm-d-inference-sim; do [[ -x $src/bin/$b ]] && mv "$src/bin/$b" "$bin/$b"; done
rm -f "$bin"/extproc-client-*
mv "$src/bin/extprocclient" "$client_bin"

complete || die "incomplete after build: $out"
"$bin/epp" --help 2>&1 | grep -q -- --pool-name || die "$bin/epp --help names no --pool-name"
log "done: $out"
echo "$bin"
