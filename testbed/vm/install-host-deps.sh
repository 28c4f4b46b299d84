#!/usr/bin/env bash
# Install the host tools the VM test harness needs (Debian/Ubuntu, run as root).
# Idempotent: does nothing (and prints nothing) when everything is present.
set -euo pipefail

# parted + e2fsprogs: build-image.sh partitions disk.raw and runs mkfs.ext4 -d on the host.
# python3-asyncssh: the real-engine benchmark's stand-in SSH hosts (testbed/standins/ssh.py) run
# under Debian's python3, so the project's venv carries no SSH server library.
pkgs=(qemu-system-x86 qemu-utils debootstrap openssh-client parted e2fsprogs python3-asyncssh)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  SUDO=(sudo)
fi

echo "install-host-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-host-deps: done" >&2
