#!/usr/bin/env bash
set -euo pipefail
# Step 80, runtime: make the node's container runtime able to start GPU containers.
# containerd: `nvidia-ctk runtime configure --runtime=containerd` (into the drop-in
#   /etc/containerd/conf.d/99-nvidia.toml when the toolkit supports --drop-in-config, >= 1.18;
#   into config.toml before that). containerd is restarted only when its configuration really
#   changed (sha256 of every file before and after), or when an earlier run stopped between
#   writing and restarting; the toolkit may rewrite a file with the same content, which does
#   not count.
# k3s / rke2: they write their own containerd config at every start and add the `nvidia`
#   runtime themselves when nvidia-container-runtime is installed; editing that file is
#   pointless (it is regenerated). The service is restarted only when its generated config
#   lacks the nvidia runtime. --set-as-default does not apply there: GPU pods use the
#   RuntimeClass `nvidia`.
# Never prints configuration contents (they may hold registry credentials).
: "${GS_RUNTIME:?}" "${GS_SET_AS_DEFAULT:?}"

need_root

# sums FILE...: SUMS becomes the sha256 (or "absent") of each file, one line each.
sums() {
  local f
  SUMS=""
  for f in "$@"; do
    if [[ -e $f ]]; then
      SUMS+="$(sha256sum <"$f") $f"$'\n'
    else
      SUMS+="absent $f"$'\n'
    fi
  done
}

case $GS_RUNTIME in
  containerd)
    need_tools nvidia-ctk containerd systemctl sha256sum
    config=/etc/containerd/config.toml dropin=/etc/containerd/conf.d/99-nvidia.toml
    args=(runtime configure --runtime=containerd --config="$config")
    [[ $GS_SET_AS_DEFAULT != true ]] || args+=(--set-as-default)
    if nvidia-ctk runtime configure --help 2>&1 | grep -q -- --drop-in-config; then
      args+=(--drop-in-config="$dropin")
    else
      dropin=""
    fi
    if [[ ! -e $config ]]; then
      # Without a config the toolkit assumes version 2, which containerd 2.x rejects: start
      # from the version this containerd speaks.
      read -r _ _ cversion _ < <(containerd --version)
      cversion=${cversion#v}
      version=2
      [[ ${cversion%%.*} -lt 2 ]] || version=3
      say "creating $config (version = $version, for containerd $cversion)"
      mkdir -p /etc/containerd
      printf 'version = %s\n' "$version" >"$config"
    fi
    files=("$config")
    [[ -z $dropin ]] || files+=("$dropin")
    # A run cut short after the toolkit wrote and before containerd restarted leaves a config the
    # daemon has not read. The marker lives in /run: a reboot clears it, and a reboot also makes
    # containerd read its config. (Comparing file mtimes with the daemon's start time was tried:
    # /proc gives whole seconds and btime is rounded down, so it saw fresh restarts as stale.)
    pending=/run/gpu-serving/containerd-restart-pending
    stale=0
    [[ ! -e $pending ]] || stale=1
    mkdir -p "${pending%/*}"
    : >"$pending"
    # The toolkit rewrites config.toml even when nothing changes: keep each file's mtime aside
    # and put it back when the content is the same, so an unchanged run leaves no trace.
    ref=$(mktemp -d)
    trap 'rm -rf "$ref"' EXIT
    for i in "${!files[@]}"; do
      [[ ! -e ${files[i]} ]] || touch -r "${files[i]}" "$ref/$i"
    done
    sums "${files[@]}"
    before=$SUMS
    nvidia-ctk "${args[@]}" >/dev/null 2>&1 || die "nvidia-ctk ${args[*]} failed; run it by hand to see why"
    sums "${files[@]}"
    if [[ $SUMS == "$before" ]]; then
      for i in "${!files[@]}"; do
        [[ ! -e $ref/$i ]] || touch -r "$ref/$i" "${files[i]}"
      done
    fi
    if [[ $SUMS == "$before" ]] && ((stale == 0)); then
      say "containerd configuration unchanged (${files[*]}); no restart"
      result=unchanged
    else
      say "containerd configuration changed (${files[*]}) or an earlier run stopped before restarting; restarting containerd"
      systemctl restart containerd
      result=changed
    fi
    rm -f "$pending"
    ;;
  k3s | rke2)
    generated=/var/lib/rancher/$GS_RUNTIME/agent/etc/containerd/config.toml
    [[ -x /usr/bin/nvidia-container-runtime || -x /usr/local/nvidia/toolkit/nvidia-container-runtime ]] ||
      die "nvidia-container-runtime is not installed; install nvidia-container-toolkit, then run pulumi up again ($GS_RUNTIME detects it when it starts)"
    if [[ -r $generated ]] && grep -qE "runtimes\\.['\"]?nvidia['\"]?\\]" "$generated"; then
      say "$GS_RUNTIME already has the nvidia runtime in $generated, unchanged"
      result=unchanged
    else
      unit=""
      for candidate in "$GS_RUNTIME" "$GS_RUNTIME-agent" "$GS_RUNTIME-server"; do
        if systemctl -q is-active "$candidate"; then
          unit=$candidate
          break
        fi
      done
      [[ -n $unit ]] || die "no running $GS_RUNTIME service found; start it, then run pulumi up again"
      say "restarting $unit so that it detects nvidia-container-runtime"
      systemctl restart "$unit"
      result=changed
    fi
    ;;
  *) die "unknown container runtime '$GS_RUNTIME'" ;;
esac
printf '{"step":"runtime","result":"%s","runtime":"%s","setAsDefault":%s}\n' "$result" "$GS_RUNTIME" "$GS_SET_AS_DEFAULT"
