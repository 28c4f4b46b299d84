#!/usr/bin/env bash
# The offline checkers `make test` runs on the serving objects, from pinned Go modules:
#   promtool   (versions.env)  runs `promtool test rules` on the PrometheusRule alerts
#              -> $GS_CACHE/promtool/<version>-<go version>/promtool
#   CRD YAML   (tools/cluster/versions.env, the same pins as the loopback cluster) gives the
#              OpenAPI schemas the PodMonitor, PrometheusRule, ScaledObject and HTTPRoute are
#              validated against -> $GS_CACHE/crds/<pins>/
# A warm cache makes this a few checks. Prints two lines: the promtool path, the CRD folder.
#
#   tools/checkers/build.sh            build/fetch what is missing
#   tools/checkers/build.sh --print    print both, fetch nothing (exit 1 if either is absent)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/versions.env"
# shellcheck source=/dev/null
source "$here/../cluster/versions.env"

: "${GS_CACHE:=$HOME/.cache/gpu-serving}"
export GOMODCACHE="$GS_CACHE/go/mod" GOCACHE="$GS_CACHE/go/build" GOFLAGS=-buildvcs=false
export CGO_ENABLED=0 GOTOOLCHAIN=local GO111MODULE=on

log() { printf '== checkers: %s\n' "$*" >&2; }
die() { printf 'checkers: %s\n' "$*" >&2; exit 1; }

crds="$GS_CACHE/crds/keda-$KEDA_VERSION-prometheus-operator-$PROMETHEUS_OPERATOR_VERSION-gateway-api-$GATEWAY_API_VERSION"
go_version=nogo
command -v go >/dev/null && go_version=$(go env GOVERSION)
out="$GS_CACHE/promtool/$PROMETHEUS_VERSION-$go_version"
bin="$out/promtool"

if [[ ${1:-} == --print ]]; then
	echo "$bin"
	echo "$crds"
	[[ -x $bin && -e $crds/.complete ]]
	exit
fi
command -v go >/dev/null || die "go is not installed (Go >= 1.26 builds promtool and fetches the CRDs)"

# module_dir MODULE@VERSION: download it (the zip holds the repository's files) and print its folder.
module_dir() {
	local json
	json=$(go mod download -json "$1") || die "go mod download $1 failed: $json"
	grep -q '"Error"' <<<"$json" && die "$1 is not served: $(grep '"Error"' <<<"$json")"
	sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$json"
}

if [[ ! -e $crds/.complete ]]; then
	mkdir -p "$crds"
	src=$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")
	install -m 0644 "$src/config/crd/bases/keda.sh_scaledobjects.yaml" "$crds/"
	src=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
	for kind in podmonitors prometheusrules servicemonitors; do
		install -m 0644 "$src/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$crds/"
	done
	src=$(module_dir "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION")
	install -m 0644 "$src/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml" "$crds/"
	touch "$crds/.complete"
	log "CRDs in $crds"
fi

if [[ ! -x $bin ]]; then
	mkdir -p "$out"
	w="$out/src"
	if [[ ! -s $w/go.sum ]]; then
		rm -rf "$w" && mkdir -p "$w"
		(
			cd "$w"
			go mod init gs-promtool >/dev/null 2>&1
			go get "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
		) >&2
	fi
	# v0.3XX.Y is Prometheus 3.XX.Y: stamp that, as the project's own release builds do.
	v=${PROMETHEUS_VERSION#v0.}
	release="3.$((10#${v%%.*} - 300)).${v#*.}"
	pkg=github.com/prometheus/common/version
	log "building promtool $release (a cold build takes minutes)"
	start=$(date +%s)
	(cd "$w" && go build -mod=mod -trimpath -o "$bin.tmp" \
		-ldflags "-s -w -X $pkg.Version=$release -X $pkg.Branch=HEAD -X $pkg.Revision=$PROMETHEUS_VERSION" \
		github.com/prometheus/prometheus/cmd/promtool)
	mv "$bin.tmp" "$bin"
	log "promtool built in $(($(date +%s) - start))s"
	"$bin" --version >&2
fi
echo "$bin"
echo "$crds"
