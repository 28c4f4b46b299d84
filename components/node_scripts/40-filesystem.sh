#!/usr/bin/env bash
set -euo pipefail
# Step 40, filesystem: XFS on /dev/md/GS_RAID_NAME, made only when `blkid -p` finds nothing on
# the array. Never `mkfs.xfs -f`: an existing filesystem of any kind is kept (ours) or refused.
: "${GS_RAID_NAME:?}"

need_root
need_tools blkid mkfs.xfs udevadm
md=/dev/md/$GS_RAID_NAME
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

probe
result=unchanged
if [[ $FS_TYPE == xfs ]]; then
  say "$md already holds XFS $FS_UUID, unchanged"
elif [[ -n $FS_TYPE || -n $PT_TYPE ]]; then
  die "$md holds ${FS_TYPE:-a $PT_TYPE partition table}, not XFS; refusing to format over it. Copy off what you need, then 'wipefs -a $md' and run pulumi up again"
else
  say "creating XFS on $md"
  mkfs.xfs -q "$md"
  udevadm settle --timeout=30 || true
  probe
  [[ $FS_TYPE == xfs ]] || die "mkfs.xfs finished but blkid does not see XFS on $md"
  result=changed
fi
printf '{"step":"filesystem","result":"%s","device":"%s","type":"xfs","uuid":"%s"}\n' "$result" "$md" "$FS_UUID"
