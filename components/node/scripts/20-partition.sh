#!/usr/bin/env bash
set -euo pipefail
# Step 20, partition: on each member disk, a GPT partition named GS_PART_NAME of GS_PART_BYTES,
# RAID flag set, in the free space after the disk's last partition (found with
# `parted -m unit B print free`, start aligned to 1 MiB). An existing partition with that name is
# recognised and kept as it is (growing is step 60). A disk is labelled GPT only when it is
# completely blank: never `mklabel` a disk that has partitions or any signature. The partition never
# goes where the other disk has a partition of its own (preflight explains; this is the backstop).
# With GS_ADOPT, the adopted array's member partitions are given our name instead (a GPT name
# only: their start, size and data stay as they are).
: "${GS_DISKS:?}" "${GS_PART_NAME:?}" "${GS_PART_BYTES:?}"

need_root
need_tools parted wipefs partx partprobe udevadm flock
node_lock 20-partition
settle
[[ -z ${GS_ADOPT:-} ]] || adopt_check
changed=0 parts=() others=() plans=()
# Before any write: where our partition would go on each disk, against the other disk's partitions.
for disk in "${GS_DISKS[@]}"; do
  resolve_disk "$disk"
  scan_disk "$DISK_DEV" "$GS_PART_NAME"
  others+=("$SCAN_OTHERS")
  plan=-1
  if [[ -z $PART_NUM && -z ${GS_ADOPT:-} ]]; then
    plan=$MIB
    [[ $SCAN_LABEL == unknown ]] || plan=$(((TAIL_START + MIB - 1) / MIB * MIB))
    [[ $SCAN_LABEL == unknown ]] || ((TAIL_START >= 0)) || plan=-1 # no room: the main loop says so
  fi
  plans+=("$plan")
done
for i in 0 1; do
  ((plans[i] >= 0)) || continue
  ! overlaps "${others[1 - i]}" "${plans[i]}" $((plans[i] + GS_PART_BYTES - 1)) ||
    die "${GS_DISKS[i]}: ${GS_DISKS[1 - i]} has partition ${OVERLAP%%:*} where ours would go; not creating it. Replicate the other disk's table first ('sgdisk -R NEW OTHER', then 'sgdisk -G NEW'; see the preflight step)"
done
i=-1
for disk in "${GS_DISKS[@]}"; do
  i=$((i + 1))
  resolve_disk "$disk"
  created=0
  scan_disk "$DISK_DEV" "$GS_PART_NAME"
  if [[ -n ${GS_ADOPT:-} && -z $PART_NUM && $SCAN_LABEL == gpt ]]; then
    read -r anum <"/sys/class/block/${ADOPT_PARTS[i]}/partition"
    say "$disk: adopting partition $anum of $GS_ADOPT: naming it $GS_PART_NAME"
    parted -s "$DISK_DEV" name "$anum" "$GS_PART_NAME"
    changed=1
    scan_disk "$DISK_DEV" "$GS_PART_NAME"
    [[ $PART_NUM == "$anum" ]] || die "parted did not name partition $anum of $disk $GS_PART_NAME"
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
