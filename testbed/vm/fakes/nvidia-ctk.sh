#!/bin/bash
# FAKE nvidia-ctk (testbed/vm/fakes/nvidia-ctk.sh).
# `nvidia-ctk runtime configure --runtime=containerd`, behaviour chosen by /etc/fake-nvidia-ctk.mode:
#   good      like 1.18.1+: writes the drop-in, adds the drop-in folder to config.toml's imports
#   1.18.0    like 1.18.0: REPLACES config.toml's imports line with its own
#   invalid   writes a drop-in containerd cannot parse (an unclosed table header)
#   noruntime makes nvidia the default runtime without configuring it: the TOML loads (config dump
#             passes) and the CRI plugin fails at containerd's start
# The drop-in carries only the nvidia runtime in the CRI section (not the rest of config.toml's CRI
# settings), so with containerd < 2.1 it overrides them. `--help` prints the flag first and then
# 256 KiB more, as a long help text does: a reader that stops at the first match closes the pipe
# while the tool still writes.
set -euo pipefail
if [[ " $* " == *" --help "* ]]; then
  printf '   --drop-in-config value  path to the NVIDIA-specific config file to create\n'
  head -c 262144 /dev/zero | tr '\0' 'x' | fold -w 79
  exit 0
fi
[[ ${1:-} == runtime && ${2:-} == configure ]] || { echo "fake nvidia-ctk: unsupported: $*" >&2; exit 2; }
mode=$(cat /etc/fake-nvidia-ctk.mode 2>/dev/null || echo good)
config=/etc/containerd/config.toml dropin=/etc/containerd/conf.d/99-nvidia.toml default=false
for a in "$@"; do
  case $a in
    --config=*) config=${a#*=} ;;
    --drop-in-config=*) dropin=${a#*=} ;;
    --set-as-default | --nvidia-set-as-default) default=true ;;
  esac
done
echo "$*" >>/var/log/fake-nvidia-ctk.log
mkdir -p "${dropin%/*}"
section='[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]'
[[ $mode != invalid ]] || section=${section%]}
{
  printf 'version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
  [[ $default != true ]] || printf '  default_runtime_name = "nvidia"\n'
  printf '\n'
  if [[ $mode != noruntime ]]; then
    printf '%s\n  runtime_type = "io.containerd.runc.v2"\n\n' "$section"
    printf '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
    printf '  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
  fi
} >"$dropin"
entry="\"${dropin%/*}/*.toml\""
text=""
found=0
while IFS= read -r line || [[ -n $line ]]; do
  if [[ $line =~ ^imports[[:space:]]*= ]]; then
    found=1
    if [[ $mode == 1.18.0 ]]; then
      line="imports = [$entry]"
    elif [[ $line != *"$entry"* ]]; then
      line="${line%]}, $entry]"
    fi
  fi
  text+="$line"$'\n'
done < <(cat "$config" 2>/dev/null || true)
((found)) || text="imports = [$entry]"$'\n'"$text"
printf '%s' "$text" >"$config"
echo "INFO[0000] Wrote updated config to $dropin" >&2
