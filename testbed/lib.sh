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
