#!/usr/bin/env bash
# The offline checkers `make test` runs on the serving objects:
#   promtool   (versions.env)  runs `promtool test rules` on the PrometheusRule alerts
#              PROMTOOL=debian (default): from Debian's prometheus package  -> $GS_CACHE/promtool/debian-<version>/promtool
#              PROMTOOL=module: built from the pinned Prometheus 3 module   -> $GS_CACHE/promtool/<version>-<go version>/promtool
#   CRD YAML   (testbed/cluster/versions.env, the same pins as the loopback cluster) gives the
#              OpenAPI schemas the PodMonitor, PrometheusRule, ScaledObject, HTTPScaledObject, HTTPRoute
#              and ReferenceGrant are validated against -> $GS_CACHE/crds/<pins>/ (module downloads,
#              nothing compiled)
# A warm cache makes this a few checks. Prints two lines: the promtool path, the CRD folder.
#
#   testbed/checkers/build.sh            fetch/build what is missing
#   testbed/checkers/build.sh --print    print both, fetch nothing (exit 1 if either is absent)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/versions.env"
# shellcheck source=/dev/null
source "$here/../cluster/versions.env"
BUILD_NAME=checkers
# shellcheck source=testbed/lib.sh
source "$here/../lib.sh"

crds="$GS_CACHE/crds/keda-$KEDA_VERSION-prometheus-operator-$PROMETHEUS_OPERATOR_VERSION-gateway-api-$GATEWAY_API_VERSION"
crds+="-http-add-on-$HTTP_ADD_ON_VERSION-$ENDPOINT_CRDS"
case ${PROMTOOL:=debian} in
debian) out="$GS_CACHE/promtool/debian-$PROMTOOL_DEBIAN_VERSION" ;;
module)
	go_version=nogo
	command -v go >/dev/null && go_version=$(go env GOVERSION)
	out="$GS_CACHE/promtool/$PROMETHEUS_VERSION-$go_version"
	;;
*) die "PROMTOOL=$PROMTOOL: use debian or module" ;;
esac
bin="$out/promtool"

if [[ ${1:-} == --print ]]; then
	echo "$bin"
	echo "$crds"
	[[ -x $bin && -e $crds/.complete ]]
	exit
fi

# promtool_debian: the pinned upstream version of bookworm's prometheus package, unpacked.
promtool_debian() {
	command -v apt-get >/dev/null || die "no apt-get here: PROMTOOL=module builds promtool with Go instead"
	local tmp deb version
	tmp=$(mktemp -d)
	chmod 0755 "$tmp" # apt's download user writes here
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" RETURN
	version=$(apt-cache madison prometheus 2>/dev/null | awk -v v="$PROMTOOL_DEBIAN_VERSION" '$3 ~ "^" v "\\+" { print $3; exit }')
	if [[ -z $version ]]; then
		apt-get update -qq >&2 || die "apt-get update failed: promtool comes from Debian's prometheus package"
		version=$(apt-cache madison prometheus | awk -v v="$PROMTOOL_DEBIAN_VERSION" '$3 ~ "^" v "\\+" { print $3; exit }')
	fi
	[[ -n $version ]] || die "Debian serves no prometheus $PROMTOOL_DEBIAN_VERSION (apt-cache madison prometheus): set PROMTOOL=module"
	(cd "$tmp" && apt-get download -qq "prometheus=$version" >&2) || die "apt-get download prometheus=$version failed"
	deb=$(ls "$tmp"/prometheus_*.deb)
	dpkg-deb -x "$deb" "$tmp/root"
	mkdir -p "$out"
	install -m 0755 "$tmp/root/usr/bin/promtool" "$bin.tmp"
	mv "$bin.tmp" "$bin"
	echo "$version" >"$out/debian-version"
	log "promtool from Debian's prometheus $version"
}

# promtool_module: promtool from the pinned Prometheus module (a cold build takes minutes).
promtool_module() {
	need_go "promtool (PROMTOOL=module)"
	wrapper "$out/src" "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
	# v0.3XX.Y is Prometheus 3.XX.Y: stamp that, as the project's own release builds do.
	local v=${PROMETHEUS_VERSION#v0.} pkg=github.com/prometheus/common/version start=$SECONDS
	local release="3.$((10#${v%%.*} - 300)).${v#*.}"
	log "building promtool $release (a cold build takes minutes)"
	(cd "$out/src" && go build -mod=mod -trimpath -o "$bin.tmp" \
		-ldflags "-s -w -X $pkg.Version=$release -X $pkg.Branch=HEAD -X $pkg.Revision=$PROMETHEUS_VERSION" \
		github.com/prometheus/prometheus/cmd/promtool)
	mv "$bin.tmp" "$bin"
	log "promtool built in $((SECONDS - start))s"
}

if [[ ! -e $crds/.complete ]] && ! command -v go >/dev/null; then
	log "no Go here to fetch the CRD schemas from their modules: the tests that need them are skipped"
elif [[ ! -e $crds/.complete ]]; then
	mkdir -p "$crds"
	src=$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")
	install -m 0644 "$src/config/crd/bases/keda.sh_scaledobjects.yaml" "$crds/"
	src=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
	for kind in podmonitors prometheusrules servicemonitors; do
		install -m 0644 "$src/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$crds/"
	done
	src=$(module_dir "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION")
	for kind in httproutes referencegrants; do
		install -m 0644 "$src/config/crd/standard/gateway.networking.k8s.io_$kind.yaml" "$crds/"
	done
	src=$(module_dir "github.com/kedacore/http-add-on@$HTTP_ADD_ON_VERSION")
	for kind in httpscaledobjects interceptorroutes; do
		install -m 0644 "$src/config/crd/bases/http.keda.sh_$kind.yaml" "$crds/"
	done
	endpoint_crds "$crds"
	touch "$crds/.complete"
	log "CRDs in $crds"
fi

if [[ ! -x $bin ]]; then
	"promtool_$PROMTOOL"
	"$bin" --version >&2
fi
echo "$bin"
echo "$crds"
