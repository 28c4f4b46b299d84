#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/delete.sh, rendered by components/node.py
# ---- delete.sh
# The `delete` of every node step. Removing a step from the stack (or `pulumi destroy`) never
# destroys data: this script changes nothing on the node and says what was kept and how to
# remove it by hand. (The disk steps are also retain_on_delete, so Pulumi normally does not even
# run it; it is the safety net if that option is ever dropped.) Its parameters are a subset of
# the step's own, so it never makes a step run again by itself.
: "${GS_STEP:?}"

kept() { printf 'gpu-serving %s: deleted from the stack; nothing on this node was changed. Kept: %s\n' "$GS_STEP" "$*"; }

case $GS_STEP in
  preflight | health) kept "nothing to keep (read-only step)." ;;
  partition)
    kept "the GPT partitions named ${GS_PART_NAME:?} on ${GS_DISKS[*]:?} ($GS_PART_BYTES bytes each)." \
      "To remove them by hand, after the array is stopped: parted DISK rm NUMBER (numbers: parted DISK print)."
    ;;
  raid)
    kept "the RAID1 /dev/md/${GS_RAID_NAME:?} (from the $GS_PART_NAME partitions of ${GS_DISKS[*]:?}) and its ARRAY line in mdadm.conf." \
      "To remove by hand: umount it, mdadm --stop /dev/md/$GS_RAID_NAME, mdadm --zero-superblock on both partitions, delete the ARRAY line, update-initramfs -u (Debian/Ubuntu)."
    ;;
  filesystem) kept "the XFS filesystem on /dev/md/${GS_RAID_NAME:?} and every file on it." ;;
  mount)
    kept "the mount of /dev/md/${GS_RAID_NAME:?} at ${GS_MOUNTPOINT:?} and its /etc/fstab line (device timeout ${GS_DEVICE_TIMEOUT:?}s)." \
      "Also kept: the boot unit gpu-serving-array-$GS_RAID_NAME.service (starts the array degraded if a disk is missing)." \
      "To remove by hand: umount $GS_MOUNTPOINT, delete the line, chattr -i $GS_MOUNTPOINT, systemctl disable gpu-serving-array-$GS_RAID_NAME.service."
    ;;
  grow) kept "the grown partitions, array and filesystem of /dev/md/${GS_RAID_NAME:?} (${GS_PART_NAME:?} on ${GS_DISKS[*]:?}, $GS_PART_BYTES bytes each); nothing shrinks." ;;
  runtime)
    kept "the ${GS_RUNTIME:?} configuration for the NVIDIA runtime (set as default: ${GS_SET_AS_DEFAULT:?}); GPU pods keep working." \
      "To remove by hand (containerd): delete /etc/containerd/conf.d/99-nvidia.toml (or the nvidia runtime in config.toml) and restart containerd."
    ;;
  *) kept "nothing (unknown step)." ;;
esac
