#!/usr/bin/env bash
# Build the throwaway Debian bookworm VM image used by the VM tests (tests/vm) and the test bed's lab VMs.
#
# Result (cached outside the repo, keyed by this script's content):
#   ${GS_VM_CACHE:-$HOME/.cache/gpu-serving}/image-<sha256(this script)[:16]>/
#     disk.raw                     3 GiB sparse raw disk: MBR + GRUB, one ext4 root partition
#     id_ed25519, id_ed25519.pub   key pair for root@guest (ssh key auth only)
# If that folder exists the script exits 0 at once. The image is built in a
# temporary folder next to it and renamed into place at the very end, so a
# killed build never leaves a half image behind.
#
# The guest boots its OWN kernel + initramfs through GRUB in the MBR (no
# -kernel/-initrd from the host), so `update-initramfs` inside the guest takes
# effect after a reboot, as on a real node. Needs root and the host tools from
# install-host-deps.sh. Takes ~2-3 min; the .debs are cached under the cache folder.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
CACHE_ROOT=${GS_VM_CACHE:-$HOME/.cache/gpu-serving}
HASH=$(sha256sum "$SELF" | cut -c1-16)
OUT="$CACHE_ROOT/image-$HASH"
MIRROR=http://deb.debian.org/debian
SUITE=bookworm
ROOT_SIZE_MIB=3071   # partition 1 starts at 1 MiB, disk is 3 GiB
PACKAGES=systemd-sysv,udev,kmod,dbus,openssh-server,mdadm,parted,gdisk,fdisk,xfsprogs,e2fsprogs,util-linux,iproute2,procps,coreutils,linux-image-amd64,initramfs-tools,zstd,grub-pc

log() { printf '[build-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if [[ -f "$OUT/disk.raw" ]]; then
  echo "$OUT"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "build-image.sh: must run as root (debootstrap, chroot)" >&2
  exit 1
fi
for tool in debootstrap mkfs.ext4 parted ssh-keygen sha256sum flock; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-image.sh: '$tool' not found; run testbed/vm/install-host-deps.sh first" >&2
    exit 1
  fi
done

mkdir -p "$CACHE_ROOT" "$CACHE_ROOT/debootstrap-cache"

# One build at a time per cache folder (parallel test sessions wait here).
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
if [[ -f "$OUT/disk.raw" ]]; then   # somebody else built it while we waited
  echo "$OUT"
  exit 0
fi

# Remove whatever earlier killed builds left behind.
umount_under() {
  local dir=$1 mnt
  # deepest first
  while read -r mnt; do
    umount -l "$mnt" 2>/dev/null || true
  done < <(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r)
}
for stale in "$CACHE_ROOT"/.build-*; do
  [[ -d "$stale" ]] || continue
  umount_under "$stale"
  rm -rf --one-file-system "$stale"
done

W=$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")
R="$W/rootfs"
cleanup() {
  umount_under "$W"
  rm -rf --one-file-system "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "debootstrap $SUITE into $R"
mkdir -p "$R"
if ! debootstrap --variant=minbase --cache-dir="$CACHE_ROOT/debootstrap-cache" \
     --include="$PACKAGES" "$SUITE" "$R" "$MIRROR" >"$W/debootstrap.log" 2>&1; then
  tail -n 40 "$W/debootstrap.log" >&2
  [[ -f "$R/debootstrap/debootstrap.log" ]] && tail -n 40 "$R/debootstrap/debootstrap.log" >&2
  echo "build-image.sh: debootstrap failed" >&2
  exit 1
fi
umount_under "$R"   # debootstrap normally unmounts proc/sys itself

log "configuring the guest"
mkdir -p "$W/out"
ssh-keygen -q -t ed25519 -N '' -C gs-vmtest -f "$W/out/id_ed25519"

echo vmtest >"$R/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tvmtest\n' >"$R/etc/hosts"
: >"$R/etc/resolv.conf"

install -d -m700 "$R/root/.ssh"
install -m600 "$W/out/id_ed25519.pub" "$R/root/.ssh/authorized_keys"
mkdir -p "$R/etc/ssh/sshd_config.d"
# UsePAM no: no logind session / user manager per login; halves the cost of each ssh
# command under TCG (~1.4 s -> ~0.8 s).
printf 'PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUseDNS no\nUsePAM no\n' \
  >"$R/etc/ssh/sshd_config.d/10-gs-vmtest.conf"

mkdir -p "$R/etc/systemd/network"
printf '[Match]\nName=en* eth*\n[Network]\nDHCP=ipv4\n' >"$R/etc/systemd/network/10-dhcp.network"
chroot "$R" systemctl --quiet enable systemd-networkd.service
chroot "$R" systemctl --quiet mask systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer \
  dpkg-db-backup.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer mdcheck_start.timer \
  mdcheck_continue.timer mdmonitor-oneshot.timer getty@tty1.service
chroot "$R" passwd -d root >/dev/null   # serial console login only; sshd refuses empty passwords

# Small initramfs: update-initramfs under TCG takes ~90 s with MODULES=list, ~750 s with "most".
sed -i 's/^MODULES=.*/MODULES=list/' "$R/etc/initramfs-tools/initramfs.conf"
# zstd's default level 9 was 19 s of a 62 s `update-initramfs -u` under TCG; level 1 takes about 2 s for a
# slightly larger image. The raid step refreshes the initramfs on every array change, so the VM tier and
# the e2e's nodes run it dozens of times. A test environment's setting, as a node's own initramfs.conf is.
echo COMPRESSLEVEL=1 >"$R/etc/initramfs-tools/conf.d/gs-vmtest-compress"
printf 'virtio_pci\nvirtio_blk\nvirtio_scsi\next4\n' >>"$R/etc/initramfs-tools/modules"
chroot "$R" update-initramfs -u -k all >"$W/update-initramfs.log" 2>&1 || {
  cat "$W/update-initramfs.log" >&2
  exit 1
}

RUUID=$(cat /proc/sys/kernel/random/uuid)
printf 'UUID=%s / ext4 errors=remount-ro 0 1\n' "$RUUID" >"$R/etc/fstab"

cat >"$R/etc/default/grub" <<'EOF'
GRUB_DEFAULT=0
GRUB_TIMEOUT=0
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=ttyS0,115200 norandmaps nvme_core.io_timeout=600 nvme_core.admin_timeout=600"
GRUB_TERMINAL="serial"
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
EOF

# norandmaps (no address space randomisation): qemu's TCG keys its translated code by virtual
# address, so with randomised mappings every exec translates ld.so and libc anew. Without it a
# fork+exec costs ~25 ms instead of ~100 ms and `update-initramfs -u` (~1,700 forks) runs 2.5x
# faster. No node script or test depends on where a process's mappings lie.
# nvme_core.*_timeout=600: under TCG on a loaded 2-core host an emulated NVMe command can wait past
# the kernel's 30 s default; the guest then resets the controller, and a failed reset drops the disk
# and degrades its array mid-test (seen once in CI: by-id link gone, /proc/mdstat [_U]). A real
# drive answers in milliseconds, so only the test bed raises it; the node scripts assume nothing.
mkdir -p "$R/boot/grub"
cp -a "$R/usr/lib/grub/i386-pc" "$R/boot/grub/"
cat >"$R/boot/grub/grub.cfg" <<EOF
# Static config written by testbed/vm/build-image.sh
serial --unit=0 --speed=115200
terminal_input serial
terminal_output serial
set default=0
set timeout=0
insmod part_msdos
insmod ext2
search --no-floppy --fs-uuid --set=root $RUUID
menuentry 'Debian GNU/Linux (gs-vmtest)' {
  linux /vmlinuz root=UUID=$RUUID ro console=ttyS0,115200 norandmaps nvme_core.io_timeout=600 nvme_core.admin_timeout=600
  initrd /initrd.img
}
EOF

chroot "$R" grub-mkimage -O i386-pc -o /tmp/core.img -p '(hd0,msdos1)/boot/grub' \
  biosdisk part_msdos ext2 search_fs_uuid
mv "$R/tmp/core.img" "$W/core.img"
cp "$R/usr/lib/grub/i386-pc/boot.img" "$W/boot.img"

# Trim what the guest never needs.
rm -f "$R"/var/cache/apt/archives/*.deb "$R"/var/cache/apt/*.bin
rm -rf "$R"/var/lib/apt/lists/* "$R/debootstrap"
rm -f "$R/var/log/dpkg.log" "$R"/var/log/apt/*

log "making disk.raw"
truncate -s 3G "$W/out/disk.raw"
# (parted on a plain file still calls udevadm, which the host may lack: log, show on error)
parted -s "$W/out/disk.raw" mklabel msdos mkpart primary ext4 1MiB 100% set 1 boot on \
  >"$W/parted.log" 2>&1 || { cat "$W/parted.log" >&2; exit 1; }
mkfs.ext4 -q -L root -U "$RUUID" -E offset=1048576 -d "$R" "$W/out/disk.raw" "${ROOT_SIZE_MIB}M"
dd if="$W/boot.img" of="$W/out/disk.raw" bs=440 count=1 conv=notrunc status=none
dd if="$W/core.img" of="$W/out/disk.raw" bs=512 seek=1 conv=notrunc status=none
sync -f "$W/out/disk.raw"

mv -T "$W/out" "$OUT"
log "image ready: $OUT"
echo "$OUT"
