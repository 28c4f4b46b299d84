#!/usr/bin/env bash
set -euo pipefail
# Step 40, filesystem: XFS on /dev/md/GS_RAID_NAME. Never `mkfs.xfs -f`, and a filesystem is made
# only on an array that has never carried data: one the raid step (30) created and whose XFS has
# not been made yet (it leaves the array's UUID in /var/lib/gpu-serving/<name>.new-array).
# - XFS found: kept ("unchanged"), unless mkfs.xfs was killed before it finished (sb_inprogress=1,
#   which libblkid ignores and the kernel refuses to mount) on an array the raid step created: then
#   it is made again.
# - anything else found, by `blkid -p` or by `wipefs -n` (which also reports signatures with a bad
#   checksum that blkid rejects, e.g. an XFS v5 superblock with one flipped byte): refused.
# - nothing found on an array we did not just create (a damaged superblock can hide a whole
#   filesystem from both): refused, with the commands to look at it.
: "${GS_RAID_NAME:?}"

need_root
need_tools blkid wipefs mkfs.xfs xfs_db mdadm udevadm flock
node_lock 40-filesystem
md=/dev/md/$GS_RAID_NAME
new_array=/var/lib/gpu-serving/$GS_RAID_NAME.new-array
[[ -b $md ]] || die "$md does not exist; the raid step (30) must run first"

# probe: FS_TYPE, FS_UUID, PT_TYPE from a low-level probe of the array (no blkid cache).
probe() {
  local rc=0 out line
  FS_TYPE="" FS_UUID="" PT_TYPE=""
  out=$(blkid -p -o export -- "$md") || rc=$?
  ((rc == 0 || rc == 2)) || die "blkid cannot probe $md (exit $rc)"
  while IFS= read -r line; do
    case $line in
      TYPE=*) FS_TYPE=${line#TYPE=} ;;
      UUID=*) FS_UUID=${line#UUID=} ;;
      PTTYPE=*) PT_TYPE=${line#PTTYPE=} ;;
    esac
  done <<<"$out"
}

# fresh_array: true when the record names the array's UUID: the raid step created it and no XFS was
# finished on it since. Sets UUID (the array's) for messages.
fresh_array() {
  local created=""
  UUID=$(array_uuid "$md")
  # A record without a final newline still names it; an empty one (a crash) names nothing.
  [[ ! -r $new_array ]] || read -r created <"$new_array" || true
  [[ -n $UUID && $created == "$UUID" ]]
}

make_xfs() {
  mkfs.xfs -q "$md"
  udevadm settle --timeout=30 || true
  probe
  [[ $FS_TYPE == xfs ]] || die "mkfs.xfs finished but blkid does not see XFS on $md"
  rm -f -- "$new_array"
}

probe
result=unchanged
if [[ $FS_TYPE == xfs ]]; then
  inprogress=$(xfs_db -r -c 'sb 0' -c 'p inprogress' "$md" 2>&1) || die "xfs_db cannot read the XFS superblock of $md: $inprogress"
  if [[ $inprogress == "inprogress = 1" ]]; then
    # mkfs.xfs clears the flag as its last write; with it set, no mount ever succeeded, so the
    # array holds nothing but the unfinished filesystem. Only on an array the raid step created:
    # a killed xfs_copy or xfs_mdrestore leaves the flag set too, on data someone may want.
    fresh_array || die "$md holds an XFS whose superblock says it was never finished (sb_inprogress=1), but it is not an array this program has just created ($new_array does not name UUID ${UUID:-?}): an interrupted xfs_copy or xfs_mdrestore looks like this. Refusing to format it. Look first ('xfs_repair -n $md'); if it is truly disposable, 'echo $UUID > $new_array' and run pulumi up again"
    say "$md holds an XFS that mkfs.xfs never finished (sb_inprogress=1; the kernel refuses to mount it); making it again"
    wipefs -q -a -t xfs -- "$md"
    make_xfs
    result=changed
  else
    say "$md already holds XFS $FS_UUID, unchanged"
    rm -f -- "$new_array"
  fi
elif [[ -n $FS_TYPE || -n $PT_TYPE ]]; then
  die "$md holds ${FS_TYPE:-a $PT_TYPE partition table}, not XFS; refusing to format over it. Copy off what you need, then 'wipefs -a $md' and run pulumi up again"
else
  sigs=$(wipefs -n --noheadings --output TYPE,OFFSET -- "$md") || die "wipefs cannot read $md"
  [[ -z $sigs ]] || die "$md holds signatures that blkid does not accept (${sigs//$'\n'/, }): a damaged filesystem (bad checksum?), not an empty array. Refusing to format it. Check it with 'xfs_repair -n $md' (XFS) and repair it; if it is really disposable, 'wipefs -a $md' and run pulumi up again"
  fresh_array || die "$md shows no filesystem, but it is not an array this program has just created ($new_array does not name UUID ${UUID:-?}); a filesystem whose superblock is damaged looks like this. Refusing to format it. Look first: 'xfs_repair -n $md' finds an XFS by its backup superblocks. If the array is truly empty, 'echo $UUID > $new_array' and run pulumi up again"
  say "creating XFS on $md"
  make_xfs
  result=changed
fi
printf '{"step":"filesystem","result":"%s","device":"%s","type":"xfs","uuid":"%s"}\n' "$result" "$md" "$FS_UUID"
