#!/usr/bin/env bash
set -euo pipefail
# Step 10, preflight (read-only): can this node take the model RAID? It changes nothing.
# Checks: tools present, both members are distinct whole disks, each has our partition
# (named GS_PART_NAME) or a free region after its last partition big enough for it, nothing
# foreign in our partitions, the array name is free or already ours, the mountpoint is free or
# already ours, and a size change in config only grows. Prints one JSON line; fails with a
# message that says what to do. Every refusal here comes before any step writes anything.
# With GS_ADOPT (storage.adopt): the named array must be a running RAID1 of one partition on each
# disk carrying XFS; those partitions stand for ours, and nothing will be created or formatted.
: "${GS_DISKS:?}" "${GS_RAID_NAME:?}" "${GS_PART_NAME:?}" "${GS_PART_BYTES:?}" "${GS_MOUNTPOINT:?}"

need_root
need_tools parted mdadm mkfs.xfs xfs_growfs xfs_info xfs_db blkid wipefs partx partprobe udevadm findmnt flock
node_lock 10-preflight
settle
((${#GS_DISKS[@]} == 2)) || die "a RAID1 needs exactly two disks, got ${#GS_DISKS[@]}"
[[ -z ${GS_ADOPT:-} ]] || adopt_check

seen=() ids=() report=() uuids=() j=""
# Per disk, in GS_DISKS order: kernel name, partitions not ours, the state of our partition
# (create | exists | grow), its start if it is to be created, and whether it is a member of our array.
bases=() others=() states=() starts=() members=()
for disk in "${GS_DISKS[@]}"; do
  resolve_disk "$disk"
  for other in "${seen[@]}"; do
    [[ $other != "$DISK_DEV" ]] || die "both storage.disks resolve to $DISK_DEV; list two different disks"
  done
  seen+=("$DISK_DEV")
  # Kernel names (sda, nvme0n1) follow probe order: a new blank disk can take the name of a member.
  [[ ! $disk =~ ^/dev/(sd|vd|hd|xvd)[a-z]+$|^/dev/nvme[0-9]+n[0-9]+$ ]] || warn "$disk is a kernel name, which can name another disk after a reboot or a disk change; list disks by /dev/disk/by-id/... (ls -l /dev/disk/by-id)"
  # Two paths to one LUN (multipath without dm-multipath, or a disk listed by two names) share a serial.
  id=""
  while IFS= read -r line; do
    case $line in ID_WWN=* | ID_SERIAL=*) id+="${line} " ;; esac
  done < <(udevadm info --query=property --name="$DISK_DEV" 2>/dev/null || true)
  for other in "${ids[@]}"; do
    [[ -z $id || $other != "$id" ]] || die "both storage.disks are the same disk seen through two paths (same ${id% }); list two different disks"
  done
  ids+=("$id")
  sigs=$(wipefs -n --noheadings --output TYPE -- "$DISK_DEV")
  [[ $sigs != *_raid_member* ]] || die "$disk ($DISK_DEV) is a member of a whole-disk RAID (${sigs//$'\n'/ }); not touching it. See 'mdadm --examine $DISK_DEV' and list other disks"
  scan_disk "$DISK_DEV" "$GS_PART_NAME"
  bases+=("$DISK_BASE") others+=("$SCAN_OTHERS") starts+=(-1) members+=(none)
  if [[ -n ${GS_ADOPT:-} ]]; then
    apart=${ADOPT_PARTS[${#bases[@]} - 1]}
    read -r anum <"/sys/class/block/$apart/partition"
    [[ $SCAN_LABEL == gpt ]] || die "$disk: adopting $GS_ADOPT needs a GPT disk (partitions are recognised by GPT name); $disk has '$SCAN_LABEL'"
    [[ -z $PART_NUM || $PART_NUM == "$anum" ]] || die "$disk: partition $PART_NUM is named $GS_PART_NAME, but $GS_ADOPT uses partition $anum; remove the stray name or partition"
    astart=$PART_START aend=$PART_END
    if [[ -z $PART_NUM ]]; then
      for span in $SCAN_OTHERS; do
        IFS=: read -r num s e _ <<<"$span"
        [[ $num != "$anum" ]] || astart=$s aend=$e
      done
    fi
    have=$((aend - astart + 1))
    if ((have > GS_PART_BYTES)); then
      size_gb_for "$have"
      die "$disk: partition $anum of the adopted $GS_ADOPT is $have bytes, more than storage.sizeGb gives ($GS_PART_BYTES); set storage.sizeGb to at least $SIZE_GB (XFS cannot shrink)"
    fi
    uuids+=("$ADOPT_UUID")
    members[-1]=$ADOPT_DEV
    states+=(adopt)
    json_str j "$disk"
    report+=("{\"disk\":$j,\"device\":\"$DISK_DEV\",\"label\":\"gpt\",\"partition\":\"adopt\",\"number\":\"$anum\",\"bytes\":$GS_PART_BYTES}")
    continue
  fi
  ((PART_COUNT <= 1)) || die "$disk has $PART_COUNT partitions named $GS_PART_NAME; remove the extra one by hand (parted $DISK_DEV rm N) after checking it holds nothing you need"
  case $SCAN_LABEL in
    gpt) ;;
    unknown)
      sigs=$(wipefs -n --noheadings --output TYPE -- "$DISK_DEV")
      [[ -z $sigs ]] || die "$disk has no partition table but holds: ${sigs//$'\n'/ }. Not touching it; if that data is disposable run 'wipefs -a $DISK_DEV', otherwise pick another disk"
      # A blank disk gets a GPT label; reserve 1 MiB at each end for the label and alignment.
      ((SCAN_BYTES >= GS_PART_BYTES + 2 * MIB)) || die "$disk is $SCAN_BYTES bytes, too small for a $GS_PART_BYTES-byte partition; lower storage.sizeGb"
      states+=(create) starts[-1]=$MIB
      json_str j "$disk"
      report+=("{\"disk\":$j,\"device\":\"$DISK_DEV\",\"label\":\"none\",\"partition\":\"create\",\"bytes\":$GS_PART_BYTES}")
      continue
      ;;
    *) die "$disk has a '$SCAN_LABEL' partition table; the partition is recognised by its GPT name, so the disk needs GPT. Do not convert a boot disk in place ('sgdisk -g' writes the GPT over sectors 1-33, where GRUB keeps its core image on a BIOS-booting MBR disk, and the node no longer boots): choose other disks, or reinstall the OS on GPT" ;;
  esac
  if [[ -n $PART_NUM ]]; then
    have=$((PART_END - PART_START + 1))
    if ((have > GS_PART_BYTES)); then
      size_gb_for "$have"
      die "$disk: partition $PART_NUM ($GS_PART_NAME) is $have bytes but config asks for $GS_PART_BYTES; shrinking is not supported (XFS cannot shrink) — set storage.sizeGb back to at least $SIZE_GB"
    fi
    if ((have < GS_PART_BYTES && PART_START + GS_PART_BYTES - 1 > AFTER_END)); then
      die "$disk: cannot grow partition $PART_NUM to $GS_PART_BYTES bytes, only $((AFTER_END - PART_START + 1)) bytes are free from its start to the next partition or the end of the disk; lower storage.sizeGb"
    fi
    find_part "$DISK_BASE" "$PART_NUM"
    [[ -n $PART_DEV ]] || die "$disk: the kernel does not show partition $PART_NUM ($GS_PART_NAME); run 'partprobe $DISK_DEV' and pulumi up again"
    state=exists
    ((have < GS_PART_BYTES)) && state=grow
    examine "$PART_DEV"
    [[ $SB_KIND != foreign ]] || die "$PART_DEV (our partition $GS_PART_NAME on $disk) holds $SB_DESC, not our array; check what it is, then wipe it ('wipefs -a $PART_DEV') or remove the partition"
    [[ -z $SB_UUID ]] || uuids+=("$SB_UUID")
    md_of "$PART_DEV"
    [[ -z $MD_OF ]] || members[-1]=$MD_OF
  else
    start=$(((TAIL_START + MIB - 1) / MIB * MIB))
    if ((TAIL_START < 0 || start + GS_PART_BYTES - 1 > TAIL_END)); then
      free=0
      ((TAIL_START < 0)) || free=$((TAIL_END - start + 1))
      die "$disk needs $GS_PART_BYTES bytes free after its last partition (it ends at byte $SCAN_LAST_END) but only $free are; lower storage.sizeGb or free space (parted $DISK_DEV unit GB print free)"
    fi
    state=create starts[-1]=$start
  fi
  states+=("$state")
  json_str j "$disk"
  report+=("{\"disk\":$j,\"device\":\"$DISK_DEV\",\"label\":\"gpt\",\"partition\":\"$state\",\"number\":\"$PART_NUM\",\"bytes\":$GS_PART_BYTES}")
done

if ((${#uuids[@]} == 2)) && [[ ${uuids[0]} != "${uuids[1]}" ]]; then
  die "the two $GS_PART_NAME partitions belong to different arrays (${uuids[0]} and ${uuids[1]}); wipe the stale one ('mdadm --zero-superblock PARTITION') so it can be re-added"
fi
ours=${uuids[0]:-}

for i in 0 1; do
  disk=${GS_DISKS[i]} peer=$((1 - i))
  # Our partition must not land where the peer disk has another partition (a blank replacement of
  # a disk that also carries the OS: its EFI/boot/root partitions must be replicated first).
  start=${starts[i]}
  if [[ ${states[i]} == create ]] && overlaps "${others[peer]}" "$start" $((start + GS_PART_BYTES - 1)); then
    IFS=: read -r num _ _ pname <<<"$OVERLAP"
    hint="give $disk the same partition table first: 'sgdisk -R ${seen[i]} ${seen[peer]}' (copies the table from ${seen[peer]}), then 'sgdisk -G ${seen[i]}' (new GUIDs), rebuild the OS mirrors on it, and run pulumi up again"
    [[ -z ${others[i]} ]] || hint="check both disks' tables (parted DISK unit B print free) and make room at the same offset on both"
    die "$disk: our partition would start at byte $start, where ${GS_DISKS[peer]} has partition $num${pname:+ ($pname)}; refusing, the peer's partitions could no longer be mirrored. To replace a disk that carries other partitions, $hint"
  fi
  # A new member joins an array only if the array is missing one (a moved kernel name otherwise makes
  # a new blank disk a spare of the healthy array), and only if it does not raise the array's
  # sector size (a 4Kn disk in a 512-byte array: XFS no longer mounts after the next assembly).
  md=${members[peer]}
  [[ $md != none && ${members[i]} == none ]] || continue
  read -r degraded <"/sys/block/$md/md/degraded"
  ((degraded > 0)) || die "$disk is not in the array, but the array /dev/$md already has all its members active (${GS_DISKS[peer]} and another); refusing to add it as a spare. If a kernel name moved (e.g. a new disk is now /dev/sdb), list the disks by /dev/disk/by-id/...; to swap a working member use 'mdadm /dev/$md --replace OLD --with NEW'"
  block_size "${bases[i]}"
  disk_bs=$BLOCK_SIZE
  block_size "$md"
  ((disk_bs <= BLOCK_SIZE)) || die "$disk has $disk_bs-byte logical sectors, the array /dev/$md has $BLOCK_SIZE-byte ones; mdadm would accept it and, at the next assembly, the array would switch to $disk_bs-byte sectors and its XFS would no longer mount. Use a replacement disk with $BLOCK_SIZE-byte sectors (512e disks are fine)"
done

array=absent
[[ -z ${GS_ADOPT:-} ]] || array=adopt
if [[ -e /dev/md/$GS_RAID_NAME ]]; then
  md_uuid=""
  while IFS= read -r line; do
    [[ $line != MD_UUID=* ]] || md_uuid=${line#MD_UUID=}
  done < <(mdadm --detail --export "/dev/md/$GS_RAID_NAME" 2>/dev/null || true)
  [[ -n $ours && $md_uuid == "$ours" ]] || die "/dev/md/$GS_RAID_NAME already exists and is not built from our $GS_PART_NAME partitions (UUID ${md_uuid:-unknown}); choose another storage.raidName"
  array=ours
fi
mdadm_conf
if [[ -r $MDADM_CONF ]]; then
  while read -r word dev rest; do
    [[ $word == ARRAY && ($dev == "/dev/md/$GS_RAID_NAME" || " $rest " == *" name="*":$GS_RAID_NAME "* || " $rest " == *" name=$GS_RAID_NAME "*) ]] || continue
    [[ -n $ours && " $rest " == *"UUID=$ours"* ]] || die "$MDADM_CONF has an ARRAY line for $GS_RAID_NAME that is not our array ($dev $rest); remove the stale line or choose another storage.raidName"
  done <"$MDADM_CONF"
fi

# The mountpoint: nothing but our array may be mounted there, or be set to mount there at boot.
md_dev=""
[[ $array != ours ]] || md_dev=$(readlink -f "/dev/md/$GS_RAID_NAME")
[[ $array != adopt ]] || md_dev=/dev/$ADOPT_DEV
# Our array running under another name (md127, after an initramfs that predates our ARRAY line):
# its mount and fstab line are ours (the mount step checks that line); the raid step names it.
running=""
if [[ $array == absent && -n $ours ]]; then
  for m in "${members[@]}"; do
    [[ $m == none ]] || running=/dev/$m
  done
  md_dev=$running
fi
# fstab lines are compared by the directory they name, however spelt (`/mnt/models/`, `/mnt//models`,
# through a symlink: fstab_paths), as mount(8) and the boot find them.
fstab_paths
current=$(findmnt -n -o SOURCE --mountpoint "$MP_PATH" 2>/dev/null || true)
if [[ -n $current && $(readlink -f -- "$current") != "$md_dev" ]]; then
  die "$current is mounted at $GS_MOUNTPOINT, not our array; unmount it or choose another storage.mountpoint"
fi
if [[ $array != ours && -z $running ]]; then
  for i in "${!FSTAB_LINES[@]}"; do
    source=${FSTAB_SOURCES[i]}
    [[ -n ${FSTAB_PATHS[i]} && ${FSTAB_PATHS[i]} == "$MP_PATH" ]] || continue
    # The adopted array's own line (by filesystem UUID or device) becomes ours in the mount step.
    if [[ $array == adopt && ($source == "UUID=$ADOPT_FS_UUID" || $(readlink -f -- "$source") == "$md_dev") ]]; then
      continue
    fi
    die "/etc/fstab line $((i + 1)) mounts $source at ${FSTAB_TARGETS[i]}, which is storage.mountpoint $GS_MOUNTPOINT: 'mount $GS_MOUNTPOINT' and the next boot would mount that instead of our array. Remove or comment out that line (or choose another storage.mountpoint), then run pulumi up again"
  done
fi

IFS=,
printf '{"step":"preflight","result":"unchanged","checks":"passed","raid":"%s","array":"%s","disks":[%s]}\n' "$GS_RAID_NAME" "$array" "${report[*]}"
