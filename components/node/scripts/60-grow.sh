#!/usr/bin/env bash
set -euo pipefail
# Step 60, grow: raising storage.sizeGb grows everything in place, data intact:
# `parted resizepart` on both members -> `partx -u` -> `mdadm --grow --size=max` (dropping and
# re-adding the internal bitmap only when mdadm says the bitmap is in the way) -> `xfs_growfs`.
# An array without a bitmap (an adopted one, or after an interrupted grow) gets one while idle.
# md refuses a size change while a resync or recovery runs: then nothing is touched and the step
# fails with the progress, to be run again later.
# Each stage looks at the real sizes first, so a run that was cut short converges next time and
# a run with nothing to do says "unchanged". Shrinking is refused: XFS cannot shrink.
: "${GS_DISKS:?}" "${GS_RAID_NAME:?}" "${GS_PART_NAME:?}" "${GS_PART_BYTES:?}"

need_root
need_tools parted partx mdadm xfs_growfs xfs_info findmnt udevadm flock
node_lock 60-grow
settle
md=/dev/md/$GS_RAID_NAME
[[ -b $md ]] || die "$md does not exist; the raid step (30) must run first"
real=$(readlink -f -- "$md")
mdbase=${real##*/}
changed=0 grew=0 members=()

# require_idle: dies unless the array is idle (no resync, recovery, check or reshape).
require_idle() {
  local action done_ total pct=""
  read -r action <"/sys/block/$mdbase/md/sync_action"
  [[ $action != idle ]] || return 0
  read -r done_ _ total <"/sys/block/$mdbase/md/sync_completed" || true
  [[ ! $done_ =~ ^[0-9]+$ || ! $total =~ ^[0-9]+$ ]] || ((total == 0)) || pct=", $((done_ * 100 / total))%"
  die "$md: $action in progress$pct — re-run pulumi up later (md refuses a size change until it finishes; watch 'cat /proc/mdstat')"
}

for disk in "${GS_DISKS[@]}"; do
  resolve_disk "$disk"
  scan_disk "$DISK_DEV" "$GS_PART_NAME"
  [[ -n $PART_NUM ]] || die "$disk has no partition named $GS_PART_NAME; the partition step (20) must run first"
  have=$((PART_END - PART_START + 1))
  if ((have > GS_PART_BYTES)); then
    size_gb_for "$have"
    die "$disk: partition $PART_NUM is $have bytes, config asks for $GS_PART_BYTES; shrinking is not supported (XFS cannot shrink) — set storage.sizeGb back to at least $SIZE_GB"
  fi
  if ((have < GS_PART_BYTES)); then
    end=$((PART_START + GS_PART_BYTES - 1))
    ((end <= AFTER_END)) || die "$disk: no room to grow partition $PART_NUM to $GS_PART_BYTES bytes (free up to byte $AFTER_END); lower storage.sizeGb"
    require_idle
    say "$disk: growing partition $PART_NUM from $have to $GS_PART_BYTES bytes"
    # parted asks for confirmation when the partition is in use, even with -s; answer it.
    parted -s "$DISK_DEV" unit B resizepart "$PART_NUM" "${end}B" 2>/dev/null ||
      printf 'Yes\n' | parted ---pretend-input-tty "$DISK_DEV" unit B resizepart "$PART_NUM" "${end}B" >/dev/null
    changed=1 grew=1
  fi
  find_part "$DISK_BASE" "$PART_NUM"
  [[ -n $PART_DEV ]] || die "the kernel does not show partition $PART_NUM of $disk; run 'partprobe $DISK_DEV' and pulumi up again"
  pbase=${PART_DEV##*/}
  read -r sectors <"/sys/class/block/$pbase/size"
  if ((sectors * 512 < GS_PART_BYTES)); then
    say "$disk: telling the kernel about the new size of $PART_DEV"
    partx -u --nr "$PART_NUM" "$DISK_DEV"
    udevadm settle --timeout=10 || true
    read -r sectors <"/sys/class/block/$pbase/size"
    ((sectors * 512 >= GS_PART_BYTES)) || die "the kernel still sees $PART_DEV as $((sectors * 512)) bytes; run 'partx -u $DISK_DEV' (or reboot) and pulumi up again"
    changed=1
  fi
  members+=("$pbase:$sectors")
done

# The array: component size (KiB) against the smallest member's room after its data offset.
read -r component <"/sys/block/$mdbase/md/component_size"
room=-1
for member in "${members[@]}"; do
  pbase=${member%%:*} sectors=${member##*:}
  [[ -r /sys/block/$mdbase/md/dev-$pbase/offset ]] || continue # not in the array (degraded)
  read -r offset <"/sys/block/$mdbase/md/dev-$pbase/offset"
  kib=$(((sectors - offset) / 2))
  ((room < 0 || kib < room)) && room=$kib
done
# add_bitmap: an array without a write-intent bitmap (built without one, e.g. by mdadm on a small
# array, or left so by an interrupted grow) gets it, but md refuses that during a resync: then
# BITMAP_PENDING=1 and the step fails at its end, after the filesystem has grown.
BITMAP_PENDING=0
add_bitmap() {
  local bitmap action
  read -r bitmap <"/sys/block/$mdbase/md/bitmap/location"
  [[ $bitmap == none ]] || return 0
  read -r action <"/sys/block/$mdbase/md/sync_action"
  if [[ $action != idle ]]; then
    BITMAP_PENDING=1
    return 0
  fi
  say "$md has no write-intent bitmap: adding it"
  mdadm --grow "$md" --bitmap=internal
  BITMAP_PENDING=0 changed=1
}

if ((room - component > 1024)); then
  require_idle
  add_bitmap
  say "growing $md from $component KiB to the members' size ($room KiB)"
  if ! err=$(mdadm --grow "$md" --size=max 2>&1); then
    [[ $err == *[Bb]itmap* ]] || die "mdadm --grow $md --size=max failed: $err"
    say "mdadm cannot resize with the internal bitmap ($err): removing it, growing, adding it back"
    mdadm --grow "$md" --bitmap=none
    mdadm --grow "$md" --size=max
  fi
  changed=1 grew=1
fi
add_bitmap

# The filesystem, where it is mounted.
mp=$(findmnt -rn -o TARGET --source "$real" | head -n1 || true)
[[ -n $mp ]] || die "the filesystem on $md is not mounted; the mount step (50) must run first"
bsize=0 blocks=0
while IFS= read -r line; do
  if [[ $line =~ ^data[[:space:]]*=[[:space:]]*bsize=([0-9]+)[[:space:]]+blocks=([0-9]+) ]]; then
    bsize=${BASH_REMATCH[1]} blocks=${BASH_REMATCH[2]}
  fi
done < <(LC_ALL=C xfs_info "$mp") # SSH sessions get the system locale: parse the C one
((bsize > 0)) || die "cannot read the XFS geometry of $mp (xfs_info)"
read -r md_sectors <"/sys/block/$mdbase/size"
if ((md_sectors * 512 - bsize * blocks >= 16 * MIB)); then
  say "growing XFS at $mp from $((bsize * blocks)) to $((md_sectors * 512)) bytes"
  xfs_growfs "$mp" >/dev/null
  changed=1 grew=1
fi

if ((BITMAP_PENDING)); then
  read -r action <"/sys/block/$mdbase/md/sync_action"
  ((grew)) || die "$md has no write-intent bitmap, and md cannot add one during the $action that runs now (watch 'cat /proc/mdstat'); run pulumi up again when it has finished"
  die "$md has grown, but md cannot add its write-intent bitmap during the $action that follows (watch 'cat /proc/mdstat'); run pulumi up again when it has finished"
fi
result=unchanged
((changed == 0)) || result=changed
size=$(df -B1 --output=size "$mp" | tail -n1)
printf '{"step":"grow","result":"%s","device":"%s","partitionBytes":%s,"filesystemBytes":%s}\n' "$result" "$md" "$GS_PART_BYTES" "${size// /}"
