#!/bin/bash
# FAKE containerd (testbed/vm/fakes/containerd.sh).
# `--version` like 1.7 (so the step treats imports as replacing whole plugin sections),
# `--config FILE config dump` loads FILE and every file its `imports` name and fails on what a TOML
# parser rejects in the shapes these tests write (an unclosed table header, a key without a value,
# an unterminated string or one-line array, a line that is neither). As a daemon it "loads the CRI
# plugin" the one way these tests need: it fails when `default_runtime_name` names a runtime no
# file configures (which `config dump` does not check, as with the real one), and FAKE ctr's
# `ctr plugins ls` shows the result; then it only sleeps, so a restart is visible through systemd's
# InvocationID without a container runtime. It cannot show any other way the real CRI fails.
set -uo pipefail
if [[ ${1:-} == --version ]]; then
  echo "containerd github.com/containerd/containerd v1.7.24 88bf19b2105c8b17560993bee28a01ddc2f97182"
  exit 0
fi
config=/etc/containerd/config.toml
if [[ ${1:-} == --config ]]; then config=$2; shift 2; fi
# loaded: config.toml and the files its imports name.
loaded() {
  local imports pattern file
  echo "$config"
  imports=$(sed -n 's/^[[:space:]]*imports[[:space:]]*=[[:space:]]*\[\(.*\)\][[:space:]]*$/\1/p' "$config" 2>/dev/null)
  for pattern in $(tr -d '",' <<<"$imports"); do
    for file in $pattern; do
      [[ ! -e $file ]] || echo "$file"
    done
  done
}
if [[ $# == 0 ]]; then
  mkdir -p /run/fake-containerd
  mapfile -t files < <(loaded)
  [[ -e $config ]] || files=()
  status=ok
  default="" key='s/^[[:space:]]*default_runtime_name[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p'
  ((${#files[@]} == 0)) || default=$(sed -n "$key" "${files[@]}" | tail -n 1)
  if [[ -n $default ]] && ! grep -qE "runtimes\.\"?$default\"?\][[:space:]]*\$" "${files[@]}"; then
    status=error
    echo "FAKE containerd: failed to load plugin io.containerd.grpc.v1.cri: no runtime for \"$default\" is configured" >&2
  fi
  # With the pid: FAKE ctr believes only a living daemon's status.
  echo "$$ $status" >/run/fake-containerd/cri
  exec sleep infinity
fi
if [[ ${1:-} == config && ${2:-} == dump ]]; then
  check() {
    local file=$1 n=0 line key='^[[:space:]]*[A-Za-z0-9_."-]+[[:space:]]*=[[:space:]]*(.*)$'
    local table='^[[:space:]]*\[\[?[^][]+\]\]?[[:space:]]*(#.*)?$'
    [[ -r $file ]] || { echo "containerd: failed to load $file: no such file" >&2; return 1; }
    while IFS= read -r line || [[ -n $line ]]; do
      n=$((n + 1))
      [[ $line =~ ^[[:space:]]*(#.*)?$ || $line =~ $table ]] && continue
      if [[ $line =~ $key ]]; then
        value=${BASH_REMATCH[1]}
        value=${value%%[[:space:]]#*}
        case $value in
          "") ;;
          \"*\" | true | false | [0-9]*) continue ;;
          \[*\]) continue ;;
        esac
      fi
      echo "containerd: failed to load TOML from $file: toml: line $n: invalid" >&2
      return 1
    done <"$file"
  }
  while IFS= read -r file; do
    check "$file" || exit 1
  done < <(loaded)
  cat "$config"
  exit 0
fi
echo "FAKE containerd: unsupported: $*" >&2
exit 2
