#!/usr/bin/env bash
set -euo pipefail
# Step 20, partition: on each member disk, a GPT partition named GS_PART_NAME of GS_PART_BYTES,
# RAID flag set, in the free space after the disk's last partition (found with
# `parted -m unit B print free`, start aligned to 1 MiB). An existing partition with that name is
# recognised and kept as it is (growing is step 60). A disk is labelled GPT only when it is
# completely blank: never `mklabel` a disk that has partitions or any signature. The partition never
# goes where the other disk has a partition of its own (preflight explains; this is the backstop).
: "${GS_DISKS:?}" "${GS_PART_NAME:?}" "${GS_PART_BYTES:?}"

need_root
need_tools parted wipefs partx partprobe udevadm flock
node_lock
settle
changed=0 parts=() others=()
for disk in "${GS_DISKS[@]}"; do
  resolve_disk "$disk"
  scan_disk "$DISK_DEV" "$GS_PART_NAME"
  others+=("$SCAN_OTHERS")
done
i=-1
for disk in "${GS_DISKS[@]}"; do
  i=$((i + 1))
  resolve_disk "$disk"
  created=0
  scan_disk "$DISK_DEV" "$GS_PART_NAME"
  if [[ $SCAN_LABEL == unknown ]] && overlaps "${others[1 - i]}" "$MIB" $((MIB + GS_PART_BYTES - 1)); then
    die "$disk is blank but ${GS_DISKS[1 - i]} has partition ${OVERLAP%%:*} where ours would go; replicate its table first ('sgdisk -R $DISK_DEV OTHER-DISK', then 'sgdisk -G $DISK_DEV'; see the preflight step)"
  fi
  if [[ $SCAN_LABEL == unknown ]]; then
    sigs=$(wipefs -n --noheadings --output TYPE -- "$DISK_DEV")
    [[ -z $sigs ]] || die "$disk has no partition table but holds: ${sigs//$'\n'/ }. Not touching it; if that data is disposable run 'wipefs -a $DISK_DEV', otherwise pick another disk"
    say "$disk: blank disk, writing a GPT label"
    parted -s "$DISK_DEV" mklabel gpt
    changed=1
    scan_disk "$DISK_DEV" "$GS_PART_NAME"
  fi
  [[ $SCAN_LABEL == gpt ]] || die "$disk has a '$SCAN_LABEL' partition table, GPT is needed (see the preflight step)"
  ((PART_COUNT <= 1)) || die "$disk has $PART_COUNT partitions named $GS_PART_NAME; remove the extra one by hand"
  if [[ -n $PART_NUM ]]; then
    say "$disk: partition $PART_NUM ($GS_PART_NAME, $((PART_END - PART_START + 1)) bytes) exists, unchanged"
  else
    start=$(((TAIL_START + MIB - 1) / MIB * MIB))
    end=$((start + GS_PART_BYTES - 1))
    ((TAIL_START >= 0 && end <= TAIL_END)) || die "$disk has no free region of $GS_PART_BYTES bytes after its last partition; lower storage.sizeGb"
    ! overlaps "${others[1 - i]}" "$start" "$end" || die "$disk: ${GS_DISKS[1 - i]} has partition ${OVERLAP%%:*} at bytes $start-$end, where ours would go; not creating it (see the preflight step)"
    say "$disk: creating partition $GS_PART_NAME at bytes $start-$end"
    parted -s -a optimal "$DISK_DEV" unit B mkpart "$GS_PART_NAME" "${start}B" "${end}B"
    changed=1 created=1
    scan_disk "$DISK_DEV" "$GS_PART_NAME"
    [[ -n $PART_NUM ]] || die "parted did not create $GS_PART_NAME on $disk"
  fi
  if [[ ",$PART_FLAGS," != *,\ raid,* && ",$PART_FLAGS," != *,raid,* ]]; then
    say "$disk: setting the raid flag on partition $PART_NUM"
    parted -s "$DISK_DEV" set "$PART_NUM" raid on
    changed=1
  fi
  # Checked once, when created: an unchanged run re-reads nothing it does not need (parted is slow).
  ((created == 0)) || parted -s "$DISK_DEV" align-check optimal "$PART_NUM" >/dev/null || warn "$disk: partition $PART_NUM is not optimally aligned"
  wait_part "$DISK_BASE" "$PART_NUM" "$DISK_DEV"
  parts+=("\"$PART_DEV\"")
done

result=unchanged
((changed == 0)) || result=changed
IFS=,
printf '{"step":"partition","result":"%s","partitions":[%s]}\n' "$result" "${parts[*]}"
