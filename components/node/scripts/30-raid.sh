#!/usr/bin/env bash
set -euo pipefail
# Step 30, raid: the RAID1 /dev/md/GS_RAID_NAME from the two GS_PART_NAME partitions.
# - members carry our superblock (name GS_RAID_NAME): assemble (or keep the running array) from
#   those members only, with --run (a stale member would otherwise leave the array inactive), and
#   add the rest afterwards;
# - both blank: mdadm --create (metadata 1.2, internal bitmap, --homehost=any so the name does not
#   depend on the hostname);
# - one ours and one blank (a replaced disk): assemble degraded, then add the blank one, but only
#   into a degraded array and only with a sector size no larger than the array's;
# - anything else on a member: refuse and leave it alone;
# - with GS_ADOPT (an array built by other tooling): it is first recorded under our name
#   (adopt_record in lib.sh), after which it is ours like one this step built.
# Then the ARRAY line (by UUID) goes once into the distro's mdadm.conf, unless mdadm, asked with the
# file as it would be, would not assemble the array from it at boot (a DEVICE line that leaves out
# the members, a second ARRAY line that matches it): that is refused, naming the line. On
# initramfs-tools distros the initramfs is refreshed when it is older than mdadm.conf, so the array
# never comes back as md127. Ends with the array health from `mdadm --detail --test`.
: "${GS_DISKS:?}" "${GS_RAID_NAME:?}" "${GS_PART_NAME:?}"

need_root
need_tools parted mdadm wipefs udevadm flock
node_lock 30-raid
settle
md=/dev/md/$GS_RAID_NAME
changed=0 members=() kinds=() uuids=()
if [[ -n ${GS_ADOPT:-} ]]; then
  adopt_check
  adopt_record
  changed=$ADOPT_CHANGED
fi
for disk in "${GS_DISKS[@]}"; do
  resolve_disk "$disk"
  scan_disk "$DISK_DEV" "$GS_PART_NAME"
  [[ -n $PART_NUM ]] || die "$disk has no partition named $GS_PART_NAME; the partition step (20) must run first"
  find_part "$DISK_BASE" "$PART_NUM"
  [[ -n $PART_DEV ]] || wait_part "$DISK_BASE" "$PART_NUM" "$DISK_DEV"
  examine "$PART_DEV"
  [[ $SB_KIND != foreign ]] || die "$PART_DEV holds $SB_DESC, not our array; refusing to touch it. Check what it is; if it is disposable, 'wipefs -a $PART_DEV' and run pulumi up again"
  members+=("$PART_DEV") kinds+=("$SB_KIND") uuids+=("$SB_UUID")
done
if [[ ${kinds[0]}${kinds[1]} == oursours && ${uuids[0]} != "${uuids[1]}" ]]; then
  # The current one runs, or is the one mdadm.conf lists: the other is stale.
  conf_uuid
  stale=""
  for i in 0 1; do
    md_of "${members[i]}"
    [[ -n $stale || ! (-n $MD_OF || ${uuids[i]} == "$CONF_UUID") ]] || stale=${members[1 - i]}
  done
  [[ -z $stale ]] || die "${members[0]} and ${members[1]} belong to different arrays (${uuids[0]}, ${uuids[1]}); $stale is the stale one (the other runs or is the one $MDADM_CONF lists). Check it holds nothing you need ('mdadm --examine $stale'), then 'mdadm --zero-superblock $stale' and run pulumi up again"
  die "${members[0]} and ${members[1]} belong to different arrays (${uuids[0]}, ${uuids[1]}), neither running nor listed in $MDADM_CONF; compare 'mdadm --examine ${members[0]} ${members[1]}' (Update Time, Events), zero the older one ('mdadm --zero-superblock PARTITION') and run pulumi up again"
fi
uuid=${uuids[0]:-${uuids[1]}}

ours=()
for i in 0 1; do
  [[ ${kinds[i]} != ours ]] || ours+=("${members[i]}")
done
# Written when this step creates the array, removed by the filesystem step once XFS is made: the
# filesystem step formats only an array that has never carried data.
new_array=/var/lib/gpu-serving/$GS_RAID_NAME.new-array

md_of "${members[0]}"
active=$MD_OF
[[ -n $active ]] || {
  md_of "${members[1]}"
  active=$MD_OF
}

if [[ -n $active ]]; then
  real=$(readlink -f -- "$md" 2>/dev/null || true)
  if [[ $real != "/dev/$active" ]]; then
    # Running under another name (md127, /dev/md/<host>:name): an old initramfs assembled it.
    if findmnt -rn --source "/dev/$active" >/dev/null; then
      # Mounted (pods may read it): named in place; its kernel name stays until the next boot.
      [[ ! -e $md ]] || die "$md names another array, while ours runs as /dev/$active; check 'mdadm --detail $md' and 'cat /proc/mdstat'"
      say "our array runs as /dev/$active and is mounted; naming it $md in place (mdadm's map and a udev event)"
      name_running "$active" "$uuid" 1.2
      changed=1
    else
      say "our array runs as /dev/$active; re-assembling it as $md"
      mdadm --stop "/dev/$active"
      mdadm --assemble --run "$md" "${ours[@]}"
      changed=1
    fi
  else
    say "$md is active, unchanged"
  fi
elif ((${#ours[@]} == 2)); then
  say "assembling $md from ${ours[*]}"
  mdadm --assemble --run "$md" "${ours[@]}"
  changed=1
elif ((${#ours[@]} == 1)); then
  say "only ${ours[0]} carries our array; starting $md degraded"
  mdadm --assemble --run "$md" "${ours[0]}"
  changed=1
else
  say "creating RAID1 $md from ${members[*]}"
  mdadm --create "$md" --name="$GS_RAID_NAME" --metadata=1.2 --level=1 --raid-devices=2 \
    --bitmap=internal --homehost=any --run "${members[@]}"
  # From the member's superblock, not /dev/md/<name>: udev may not have made that link yet. Synced,
  # so a crash cannot leave an empty record (the filesystem step formats only what it names).
  created=$(mdadm --examine --export "${members[0]}" 2>/dev/null | sed -n 's/^MD_UUID=//p') || true
  [[ -n $created ]] || die "mdadm created $md but ${members[0]} shows no array UUID; check 'mdadm --examine ${members[0]}' and 'cat /proc/mdstat', then run pulumi up again"
  mkdir -p "${new_array%/*}"
  write_atomic "$new_array" 644 "$created"$'\n'
  changed=1
fi
udevadm settle --timeout=30 || true
[[ -b $md ]] || die "$md did not appear after assembling; check 'cat /proc/mdstat' and 'mdadm --detail --scan'"

# Array facts; add back a blank member (replaced disk) or our member that dropped out.
detail=$(mdadm --detail --export "$md")
uuid=${detail#*MD_UUID=}
uuid=${uuid%%$'\n'*}
md_name=${detail#*MD_NAME=}
md_name=${md_name%%$'\n'*}
real=$(readlink -f -- "$md")
for i in 0 1; do
  part=${members[i]}
  md_of "$part"
  [[ -z $MD_OF ]] || continue
  [[ ${kinds[i]} == none || ${uuids[i]} == "$uuid" ]] || continue
  # Checked again here (preflight checks first): a spare in a healthy array is a disk that was
  # meant for something else, and a larger sector size breaks the filesystem at the next assembly.
  read -r degraded <"/sys/block/${real##*/}/md/degraded"
  ((degraded > 0)) || die "$part is not in $md, but $md already has all its members active; refusing to add it as a spare. If a kernel name moved, list the disks by /dev/disk/by-id/..."
  block_size "${part##*/}"
  part_bs=$BLOCK_SIZE
  block_size "${real##*/}"
  ((part_bs <= BLOCK_SIZE)) || die "$part has $part_bs-byte logical sectors, $md has $BLOCK_SIZE-byte ones; adding it would switch the array to $part_bs-byte sectors at the next assembly and XFS would no longer mount. Use a replacement disk with $BLOCK_SIZE-byte sectors"
  if [[ ${kinds[i]} == none ]]; then
    say "adding the blank member $part to $md (a resync follows)"
    mdadm "$md" --add "$part"
    changed=1
  elif [[ ${uuids[i]} == "$uuid" ]]; then
    say "re-adding $part to $md"
    mdadm "$md" --re-add "$part" 2>/dev/null || mdadm "$md" --add "$part"
    changed=1
  fi
done

# mdadm.conf: one ARRAY line for our UUID.
mdadm_conf
line="ARRAY $md metadata=1.2 UUID=$uuid name=$md_name"
found=0
if [[ -r $MDADM_CONF ]]; then
  while read -r word dev rest || [[ -n $word ]]; do
    [[ $word == ARRAY ]] || continue
    if [[ " $rest " == *" UUID=$uuid "* ]]; then
      found=1
      [[ $dev == "$md" ]] || warn "$MDADM_CONF names our array $dev, not $md; fix that line by hand"
    elif [[ $dev == "$md" ]]; then
      die "$MDADM_CONF has a line for $md with another UUID ($dev $rest); remove that stale line and run again"
    fi
  done <"$MDADM_CONF"
fi
# $(<) drops the final newline(s), so a file without one does not get the line glued onto its last.
text=""
[[ ! -s $MDADM_CONF ]] || text=$(<"$MDADM_CONF")$'\n'
((found)) || text+=$line$'\n'

# Will the next boot assemble our array from this mdadm.conf? Asked of mdadm itself, before anything
# is written: at boot udev runs `mdadm --incremental MEMBER LINKS...` for each member (in the
# initramfs with its copy of mdadm.conf; after the switch to the root filesystem, for an array still
# down, with mdadm.conf.d/*.conf as well: asked so). The same command on a member the running array
# holds reads every line that decides, then stops without changing anything, as it cannot open the
# member exclusively ("cannot reopen ...: Device or resource busy"): DEVICE (the devices that may be
# members: globs, `partitions`, `containers`; without a DEVICE line, partitions), ARRAY (exactly one
# line must match the member: with a second one by our UUID or name, or an `<ignore>` one, mdadm
# assembles neither), AUTO and HOMEHOST (they decide only for an array no ARRAY line matches: with
# ours they are harmless, and accepted). Only members md holds are asked: another it would assemble.
# Refused, never fixed here: a DEVICE line filters every array of the node and is often narrowed on
# purpose (multipath nodes list only /dev/mapper/* so that md never assembles over one path of a
# LUN), and an ARRAY line that matches ours may be meant for an array on disks absent now. Widening
# the one or dropping the other could break another array; the operator knows which.
mdadm_conf_assembles() {
  local check=$LOCK_DIR/mdadm.conf.check all=$1 frag part out rc said word l a b fix named links=()
  for frag in "$MDADM_CONF.d"/*.conf; do
    [[ ! -f $frag ]] || all+=$(<"$frag")$'\n'
  done
  printf '%s' "$all" >"$check"
  for part in "${members[@]}"; do
    md_of "$part"
    [[ $MD_OF == "${real##*/}" ]] || continue
    links=()
    while IFS= read -r l; do
      [[ $l != DEVLINKS=* ]] || read -ra links <<<"${l#DEVLINKS=}"
    done < <(udevadm info --query=property --name="$part" 2>/dev/null || true)
    rc=0
    out=$(mdadm --incremental --verbose --verbose --config="$check" "$part" "${links[@]}" 2>&1) || rc=$?
    [[ $out != *"cannot reopen $part"* ]] || continue
    rm -f "$check"
    # What mdadm said, less the "UUID differs" it says of every other array.
    said=""
    while IFS= read -r l; do
      [[ -n $l && $l != *"UUID differs"* ]] || continue
      l=${l#mdadm: }
      said+="${said:+; }${l%.}"
    done <<<"$out"
    case $out in
      *"not permitted by mdadm.conf"*)
        word=device
        fix="add a pattern that matches $part to that line"
        [[ ! ${part##*/} =~ ^(nvme|mmcblk|xvd|sd|vd|hd) ]] || fix+=" (e.g. /dev/${BASH_REMATCH[1]}*)"
        fix+=", or make it 'DEVICE partitions' (mdadm's default)"
        ;;
      *"we match both"* | *"multiple lines in mdadm.conf match"* | *"explicitly ignored"*)
        word=array
        fix="remove the line(s) not meant for $md (UUID $uuid), or give each the UUID= of its own array"
        ;;
      *"auto-assembly is disabled"*)
        word=auto
        fix="make the ARRAY line for UUID $uuid match $part (no devices= that leave it out), or let the AUTO line allow its metadata (+1.x)"
        ;;
      *) die "cannot tell whether $MDADM_CONF lets the next boot assemble $md: 'mdadm --incremental $part' (a dry run, which stops at the member the array holds) ended with exit $rc and ${said:-no message}, not 'cannot reopen'; check 'mdadm --examine $part', then run pulumi up again. $MDADM_CONF was not changed" ;;
    esac
    # The lines to fix: keywords count by their first three letters or more, in any case; of the
    # ARRAY lines, those other than ours that name our array (UUID, name) or that mdadm named.
    named=""
    while IFS= read -r l; do
      read -r a b _ <<<"$l"
      a=${a,,}
      [[ ${#a} -ge 3 && $word == "$a"* ]] || continue
      if [[ $word == array ]]; then
        [[ $l != "$line" ]] || continue
        [[ $l == *"$uuid"* || " $l " == *" name=$md_name "* || " $l " == *" name=${md_name#*:} "* || "$out " == *" $b "* ]] || continue
      fi
      named+="${named:+ and }'$l'"
    done <<<"$all"
    die "$MDADM_CONF would keep $md from being assembled at the next boot: ${named:-a line of it} (mdadm --incremental $part: $said). Fix: $fix; then run pulumi up again. $MDADM_CONF was not changed"
  done
  rm -f "$check"
}
mdadm_conf_assembles "$text"
if ((found)); then
  say "$MDADM_CONF lists UUID $uuid, unchanged"
else
  say "adding to $MDADM_CONF: $line"
  mkdir -p "${MDADM_CONF%/*}"
  # Rewritten whole and synced, not appended: a power cut leaves the old file or the new one.
  write_atomic "$MDADM_CONF" "$(stat -c %a "$MDADM_CONF" 2>/dev/null || echo 644)" "$text"
  changed=1
fi

# initramfs-tools (Debian/Ubuntu) assembles every array it finds in early boot, naming the ones
# its copy of mdadm.conf does not list md127: rebuild each initramfs older than mdadm.conf.
# dracut (RHEL/Rocky) only assembles the arrays named by rd.md.uuid= and leaves ours to udev
# after switch-root, which reads /etc/mdadm.conf: no rebuild needed there.
# Only the images of installed kernels (/lib/modules/<version> and /boot/vmlinuz-<version>):
# /boot/initrd.img-* also matches DKMS's rollback copies (*.old-dkms) and hand-made *.bak files,
# which must keep their content.
if command -v update-initramfs >/dev/null; then
  for modules in /lib/modules/*/; do
    modules=${modules%/}
    version=${modules##*/}
    img=/boot/initrd.img-$version
    [[ -e /boot/vmlinuz-$version && -e $img && ! $img -nt $MDADM_CONF ]] || continue
    say "refreshing the initramfs for $version (its mdadm.conf predates our ARRAY line)"
    update-initramfs -u -k "$version" >/dev/null
    changed=1
  done
fi

rc=0
mdadm --detail --test "$md" >/dev/null 2>&1 || rc=$?
state=$(mdadm --detail "$md" | sed -n 's/^ *State : *//; T; s/ *$//p')
array_health "$rc" "$state"
health=$ARRAY_HEALTH
[[ $health != degraded ]] || warn "$md is degraded ($state): it works on one disk; replace the failed member and run pulumi up again to add it back"
result=unchanged
((changed == 0)) || result=changed
printf '{"step":"raid","result":"%s","device":"%s","uuid":"%s","health":"%s","state":"%s","members":["%s","%s"]}\n' \
  "$result" "$md" "$uuid" "$health" "$state" "${members[0]}" "${members[1]}"
