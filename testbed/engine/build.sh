#!/usr/bin/env bash
# make engine: build the real Pulumi engine (CLI, Python language host, kubernetes and command
# providers; the YAML and Node.js language hosts for the component package's examples) from pinned
# Go modules, cache the binaries outside the repo, and install them into the project-local
# PULUMI_HOME (.pulumi-home/). A warm cache makes this a few seconds of checks.
#
# Where the module proxy serves no version of a piece (see versions.env), its source is, in order:
#   1. the cache ($GS_CACHE/src/<commit>-<paths>.tar, written by an earlier build);
#   2. GS_ENGINE_SRC, a folder of source archives named as that cache names them
#      (<commit>-<paths>.tar or .tar.gz), used only when the sha256 of the tar stream is the one
#      pinned in versions.env;
#   3. git at the pinned tag, checked against the pinned commit:
#        GS_PULUMI_GIT          pulumi/pulumi          (default https://github.com/pulumi/pulumi.git)
#        GS_PULUMI_COMMAND_GIT  pulumi/pulumi-command  (default https://github.com/pulumi/pulumi-command.git)
#      Each may be a URL or a local clone (bare or not).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=testbed/engine/env.sh
source "$here/env.sh"
BUILD_NAME=engine
# shellcheck source=testbed/lib.sh
source "$here/../lib.sh"

: "${GS_PULUMI_GIT:=https://github.com/pulumi/pulumi.git}"
: "${GS_PULUMI_COMMAND_GIT:=https://github.com/pulumi/pulumi-command.git}"

src_cache="$GS_CACHE/src"
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

need_go "the engine"

# archive_tree NAME SHA256: copy GS_ENGINE_SRC's archive NAME(.tar or .tar.gz) into the cache as
# NAME.tar, if there is one and its tar stream has the pinned checksum. Returns 1 when there is none.
archive_tree() {
	local name=$1 want=$2 archive cat=cat got
	[[ -n ${GS_ENGINE_SRC:-} ]] || return 1
	if [[ -s $GS_ENGINE_SRC/$name.tar.gz ]]; then
		archive=$GS_ENGINE_SRC/$name.tar.gz cat="gzip -dc"
	elif [[ -s $GS_ENGINE_SRC/$name.tar ]]; then
		archive=$GS_ENGINE_SRC/$name.tar
	else
		log "GS_ENGINE_SRC has no $name.tar[.gz]: trying git"
		return 1
	fi
	mkdir -p "$src_cache"
	$cat "$archive" >"$src_cache/$name.tar.tmp"
	got=$(sha256sum <"$src_cache/$name.tar.tmp" | cut -d' ' -f1)
	if [[ $got != "$want" ]]; then
		rm -f "$src_cache/$name.tar.tmp"
		die "$archive: sha256 of its tar is $got, pinned $want (versions.env): not using it; remove it or fix GS_ENGINE_SRC"
	fi
	mv "$src_cache/$name.tar.tmp" "$src_cache/$name.tar"
	log "source from $archive (sha256 checked)"
}

# git_tree URL_OR_DIR TAG COMMIT SHA256 DEST SUBDIR...: DEST gets the SUBDIRs of TAG (no tests, no
# test data), from the cache, GS_ENGINE_SRC or git (see the top). From git, TAG must be COMMIT.
git_tree() {
	local source=$1 tag=$2 commit=$3 sha256=$4 dest=$5
	shift 5
	local name tarball
	name="$commit-$(IFS=_; echo "$*")"
	tarball="$src_cache/$name.tar"
	if [[ ! -s $tarball ]] && ! archive_tree "$name" "$sha256"; then
		local gitdir=$source
		[[ -d $source/.git ]] && gitdir=$source/.git
		if [[ ! -d $source ]]; then
			log "cloning $source at $tag"
			gitdir="$work/clone-$commit"
			git clone --quiet --bare --depth 1 --branch "$tag" "$source" "$gitdir" ||
				die "cannot clone $source at $tag: set GS_ENGINE_SRC to a folder of source archives, or GS_PULUMI_GIT / GS_PULUMI_COMMAND_GIT to a reachable clone"
		fi
		local got
		got=$(git --git-dir="$gitdir" rev-parse --verify --quiet "$tag^{commit}") || die "$source has no tag $tag"
		[[ $got == "$commit" ]] || die "$source: tag $tag is $got, pinned $commit"
		local files="$work/files-$commit" stage="$work/stage-$commit"
		git --git-dir="$gitdir" ls-tree -r --format='%(objectname) %(path)' "$commit" -- "$@" |
			grep -v -e '/testdata/' -e '_test\.go$' >"$files"
		# Mirrors may lack large blobs the build never reads (vendored JS); leave out what is absent.
		cut -d' ' -f1 "$files" | git --git-dir="$gitdir" cat-file --batch-check |
			awk '$2 == "missing" { print $1 }' >"$files.missing"
		mkdir -p "$stage" "$src_cache"
		GIT_INDEX_FILE="$work/index-$commit" git --git-dir="$gitdir" read-tree "$commit"
		grep -v -F -f "$files.missing" "$files" | cut -d' ' -f2- | tr '\n' '\0' |
			GIT_INDEX_FILE="$work/index-$commit" git --git-dir="$gitdir" --work-tree="$stage" checkout-index -z --stdin
		tar -C "$stage" -cf "$tarball.tmp" .
		mv "$tarball.tmp" "$tarball"
	fi
	mkdir -p "$dest"
	tar -x -C "$dest" -f "$tarball"
}

build_cli() {
	local out=$1 dir="$work/cli"
	log "pulumi CLI v$PULUMI_VERSION"
	wrapper "$dir" "github.com/pulumi/pulumi/pkg/v3@v$PULUMI_VERSION" \
		"github.com/atotto/clipboard=github.com/tgummerer/clipboard@v0.0.0-20241001131231-d02d263e614e"
	(
		cd "$dir"
		go get "github.com/pulumi/pulumi/sdk/v3@v$PULUMI_VERSION"
		printf '//go:build tools\n\npackage wrapper\n\nimport _ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"\n' >tools.go
		go mod tidy
		go build -trimpath -o "$out/pulumi" \
			-ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$PULUMI_VERSION" \
			github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
	)
}

build_python_host() {
	local out=$1 dir="$work/pulumi"
	log "python language host $PYTHON_HOST_TAG"
	git_tree "$GS_PULUMI_GIT" "$PYTHON_HOST_TAG" "$PYTHON_HOST_COMMIT" "$PYTHON_HOST_SRC_SHA256" "$dir" pkg sdk
	(
		cd "$dir/sdk/python/cmd/pulumi-language-python"
		go build -trimpath -o "$out/pulumi-language-python" \
			-ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PYTHON_HOST_TAG" .
	)
	# The host refuses to start unless its exec shim lies beside it.
	install -m 0755 "$dir/sdk/python/cmd/pulumi-language-python-exec" "$out/pulumi-language-python-exec"
}

build_nodejs_host() {
	local out=$1 dir="$work/pulumi"
	log "nodejs language host $PYTHON_HOST_TAG"
	# The same checkout as the Python host's (pulumi/pulumi's sdk/), built the same way.
	[[ -d $dir/sdk/nodejs ]] || git_tree "$GS_PULUMI_GIT" "$PYTHON_HOST_TAG" "$PYTHON_HOST_COMMIT" "$PYTHON_HOST_SRC_SHA256" "$dir" pkg sdk
	(
		cd "$dir/sdk/nodejs/cmd/pulumi-language-nodejs"
		go build -trimpath -o "$out/pulumi-language-nodejs" \
			-ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PYTHON_HOST_TAG" .
	)
}

build_yaml_host() {
	local out=$1 dir="$work/yaml"
	log "yaml language host v$YAML_HOST_VERSION"
	wrapper "$dir" "github.com/pulumi/pulumi-yaml@v$YAML_HOST_VERSION"
	(
		cd "$dir"
		# yaml-host/main.go: pulumi-yaml's host with the engine's schema loader (why: its comment).
		cp "$here/yaml-host/main.go" main.go
		go mod tidy
		go build -trimpath -o "$out/pulumi-language-yaml" \
			-ldflags "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=v$YAML_HOST_VERSION" .
	)
}

build_kubernetes() {
	local out=$1 dir="$work/kubernetes"
	local module=github.com/pulumi/pulumi-kubernetes/provider/v4
	log "kubernetes provider v$KUBERNETES_VERSION ($KUBERNETES_MODULE_VERSION)"
	local zipdir
	zipdir=$(cd "$work" && go mod download -json "$module@$KUBERNETES_MODULE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[[ -d $zipdir ]] || die "module $module@$KUBERNETES_MODULE_VERSION not downloaded"
	# A writable copy: main.go embeds files that generate.go writes, and go.mod points sdk/v4 at ../sdk.
	cp -r "$zipdir" "$dir"
	chmod -R u+w "$dir"
	(
		cd "$dir"
		go mod edit -replace "github.com/pulumi/pulumi-kubernetes/sdk/v4=github.com/pulumi/pulumi-kubernetes/sdk/v4@v$KUBERNETES_VERSION"
		go mod tidy
		cd cmd/pulumi-resource-kubernetes
		VERSION="v$KUBERNETES_VERSION" go run generate.go schema.json "v$KUBERNETES_VERSION"
		[[ -s schema-embed.json && -s terraform-mapping-embed.json ]] || die "generate.go wrote no embedded schema"
		# Without the compiler's optimisations (-N -l): this provider is two thirds of a cold engine
		# build, and -N -l takes about 27 % off the CPU of a Go build (a kwok build, measured:
		# 170 s against 123 s of CPU). What it costs is run time in the provider's own calls,
		# which the e2e checks and the real-engine benchmark pay alike for our program and the bare one.
		go build -trimpath -gcflags=all="-N -l" -o "$out/pulumi-resource-kubernetes" \
			-ldflags "-s -w -X $module/pkg/version.Version=v$KUBERNETES_VERSION" .
	)
}

build_command() {
	local out=$1 dir="$work/command"
	log "command provider v$COMMAND_VERSION"
	git_tree "$GS_PULUMI_COMMAND_GIT" "v$COMMAND_VERSION" "$COMMAND_COMMIT" "$COMMAND_SRC_SHA256" "$dir" provider
	(
		cd "$dir/provider"
		go build -trimpath -o "$out/pulumi-resource-command" \
			-ldflags "-s -w -X github.com/pulumi/pulumi-command/provider/pkg/version.Version=v$COMMAND_VERSION" \
			./cmd/pulumi-resource-command
	)
}

# build NAME BINARY FUNCTION [DIR]: run FUNCTION unless DIR/bin/BINARY is cached (DIR: GS_ENGINE); record its
# build time.
build() {
	local name=$1 binary=$2 fn=$3 dir=${4:-$GS_ENGINE}
	[[ -x $dir/bin/$binary ]] && return 0
	local staging="$work/out-$name" start=$SECONDS
	mkdir -p "$staging" "$dir/bin"
	"$fn" "$staging"
	chmod 0755 "$staging"/*
	mv "$staging"/* "$dir/bin/"
	printf '%s %s\n' "$name" $((SECONDS - start)) >>"$dir/build-seconds.txt"
	log "$name built in $((SECONDS - start)) s"
}

# `build.sh [cli|python-host|kubernetes|command|yaml-host|nodejs-host]...` builds only those (and installs nothing).
# The YAML and Node.js hosts run the component package's examples (docs/package.md); a folder of their own
# (GS_HOSTS), so that a change of their pins rebuilds them alone.
wanted=" ${*:-cli python-host kubernetes command yaml-host nodejs-host} "
[[ $wanted == *" cli "* ]] && build cli pulumi build_cli
[[ $wanted == *" python-host "* ]] && build python-host pulumi-language-python build_python_host
[[ $wanted == *" kubernetes "* ]] && build kubernetes pulumi-resource-kubernetes build_kubernetes
[[ $wanted == *" command "* ]] && build command pulumi-resource-command build_command
[[ $wanted == *" yaml-host "* ]] && build yaml-host pulumi-language-yaml build_yaml_host "$GS_HOSTS"
[[ $wanted == *" nodejs-host "* ]] && build nodejs-host pulumi-language-nodejs build_nodejs_host "$GS_HOSTS"
(($# == 0)) || exit 0

# Install into the project's PULUMI_HOME the way the CLI itself installs a plugin.
mkdir -p "$PULUMI_HOME"
for plugin in "kubernetes=$KUBERNETES_VERSION" "command=$COMMAND_VERSION"; do
	name=${plugin%=*} version=${plugin#*=}
	installed=$PULUMI_HOME/plugins/resource-$name-v$version/pulumi-resource-$name
	if ! cmp -s "$GS_ENGINE/bin/pulumi-resource-$name" "$installed"; then
		rm -rf "$PULUMI_HOME/plugins/resource-$name-v$version"
		"$GS_ENGINE/bin/pulumi" plugin install resource "$name" "$version" --file "$GS_ENGINE/bin/pulumi-resource-$name" >/dev/null
	fi
done

# The YAML and Node.js hosts beside the CLI: it looks for the language hosts it bundles there, and (with
# PULUMI_IGNORE_AMBIENT_PLUGINS) nowhere else. Hard links: a symlink would point the hosts' own lookups elsewhere.
for host in pulumi-language-yaml pulumi-language-nodejs; do
	cmp -s "$GS_HOSTS/bin/$host" "$GS_ENGINE/bin/$host" || ln -f "$GS_HOSTS/bin/$host" "$GS_ENGINE/bin/$host"
done

log "ready: $GS_ENGINE/bin (PULUMI_HOME=$PULUMI_HOME)"
"$GS_ENGINE/bin/pulumi" version
"$GS_ENGINE/bin/pulumi" plugin ls
