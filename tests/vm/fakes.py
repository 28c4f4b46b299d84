"""Stand-ins for the container runtime pieces the test VM does not have (NVIDIA's and containerd's
packages are not installable here: the guest reaches no network). Each is a small bash script that
does what the node steps rely on, no more; each says FAKE in its first lines.
"""

from __future__ import annotations

from typing import Any

# containerd: `--version` like 1.7 (so the step treats imports as replacing whole plugin sections),
# `--config FILE config dump` loads FILE and every file its `imports` name and fails on what a TOML
# parser rejects in the shapes these tests write (an unclosed table header, a key without a value,
# an unterminated string or one-line array, a line that is neither). As a daemon it "loads the CRI
# plugin" the one way these tests need: it fails when `default_runtime_name` names a runtime no
# file configures (which `config dump` does not check, as with the real one), and FAKE_CTR's
# `ctr plugins ls` shows the result; then it only sleeps, so a restart is visible through systemd's
# InvocationID without a container runtime. It cannot show any other way the real CRI fails.
FAKE_CONTAINERD = r"""#!/bin/bash
# FAKE containerd (tests/vm/fakes.py).
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
"""
# ctr `plugins ls`, as containerd's ctr prints it (TYPE ID PLATFORMS STATUS), with the CRI plugin's
# status as FAKE containerd loaded it; "failed to dial" while the daemon is not running.
FAKE_CTR = r"""#!/bin/bash
# FAKE ctr (tests/vm/fakes.py).
set -uo pipefail
[[ "$*" == "plugins ls" ]] || { echo "FAKE ctr: unsupported: $*" >&2; exit 2; }
read -r pid status </run/fake-containerd/cri 2>/dev/null
if [[ -z ${pid:-} || ! -d /proc/$pid ]]; then
  echo 'ctr: failed to dial "/run/containerd/containerd.sock": connection refused' >&2
  exit 1
fi
printf '%-32s%-12s%-16s%s\n' TYPE ID PLATFORMS STATUS \
  io.containerd.content.v1 content - ok \
  io.containerd.snapshotter.v1 overlayfs linux/amd64 ok \
  io.containerd.grpc.v1 cri linux/amd64 "$status"
"""
CONTAINERD_UNIT = "[Unit]\nDescription=FAKE containerd (tests)\n[Service]\nExecStart=/usr/local/bin/containerd\n"


def install_fake_containerd(vm: Any) -> None:
    """FAKE containerd (running as containerd.service), ctr and nvidia-ctk in the guest of ``vm``."""
    vm.put_file(FAKE_NVIDIA_CTK, "/usr/local/bin/nvidia-ctk", "0755")
    vm.put_file(FAKE_CONTAINERD, "/usr/local/bin/containerd", "0755")
    vm.put_file(FAKE_CTR, "/usr/local/bin/ctr", "0755")
    vm.put_file(CONTAINERD_UNIT, "/etc/systemd/system/containerd.service")
    vm.ssh("systemctl daemon-reload && systemctl restart containerd")

# nvidia-ctk `runtime configure --runtime=containerd`, behaviour chosen by /etc/fake-nvidia-ctk.mode:
#   good      like 1.18.1+: writes the drop-in, adds the drop-in folder to config.toml's imports
#   1.18.0    like 1.18.0: REPLACES config.toml's imports line with its own
#   invalid   writes a drop-in containerd cannot parse (an unclosed table header)
#   noruntime makes nvidia the default runtime without configuring it: the TOML loads (config dump
#             passes) and the CRI plugin fails at containerd's start
# The drop-in carries only the nvidia runtime in the CRI section (not the rest of config.toml's CRI
# settings), so with containerd < 2.1 it overrides them. `--help` prints the flag first and then
# 256 KiB more, as a long help text does: a reader that stops at the first match closes the pipe
# while the tool still writes.
FAKE_NVIDIA_CTK = r"""#!/bin/bash
# FAKE nvidia-ctk (tests/vm/fakes.py).
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
"""

# A k3s/rke2 service: at start (ExecStartPre) it writes its generated containerd config, with the
# nvidia runtime only when /etc/fake-k3s.detects exists (standing in for "it found
# nvidia-container-runtime"); then it only sleeps.
FAKE_K3S_START = r"""#!/bin/bash
# FAKE k3s/rke2 start (tests/vm/fakes.py): writes the generated containerd config as k3s does.
set -eu
generated=/var/lib/rancher/$1/agent/etc/containerd/config.toml
mkdir -p "${generated%/*}"
{
  printf 'version = 2\n'
  if [[ -e /etc/fake-k3s.detects ]]; then
    printf '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]\n  runtime_type = "io.containerd.runc.v2"\n'
  fi
} >"$generated"
"""


def fake_k3s_unit(kind: str, unit: str) -> str:
    """A unit file for FAKE service `unit` of `kind` (k3s or rke2); FAKE_K3S_START goes to /usr/local/bin/fake-k3s-start."""
    return (f"[Unit]\nDescription=FAKE {unit} (tests)\n[Service]\n"
            f"ExecStartPre=/usr/local/bin/fake-k3s-start {kind}\nExecStart=/bin/sleep infinity\n")
