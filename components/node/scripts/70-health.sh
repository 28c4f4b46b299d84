#!/usr/bin/env bash
set -euo pipefail
# Step 70, health (read-only): one JSON line with the array's state from `mdadm --detail --test`
# (clean, resyncing, degraded, failed, absent; see array_health in lib.sh), its UUID, the
# filesystem UUID, the mountpoint and the usable bytes `df` reports. A degraded array still serves:
# the step succeeds and the stack shows the state in its outputs and as a warning. The state is as
# of this step's last run, which is the first `up` and every one that changes the disks (GS_DISKS
# is given for that alone: a replaced disk is measured again) or the array's name or mountpoint;
# `pulumi up --replace <this step's URN>` measures again, 'cat /proc/mdstat' is the live view.
: "${GS_RAID_NAME:?}" "${GS_MOUNTPOINT:?}"
# shellcheck disable=SC2034  # GS_DISKS: only so that a disk change re-runs this step (see above)
: "${GS_DISKS:?}"

need_root
need_tools mdadm blkid findmnt df flock
node_lock 70-health

md=/dev/md/$GS_RAID_NAME
health=absent mp="" state="" uuid="" fs_uuid="" mounted=false bytes=0 active=0 total=0
if [[ -b $md ]]; then
  rc=0
  detail=$(mdadm --detail --test "$md" 2>/dev/null) || rc=$?
  while IFS= read -r line; do
    line=${line#"${line%%[![:space:]]*}"}
    case $line in
      "State : "*) state=${line#State : } state=${state%"${state##*[![:space:]]}"} ;;
      "UUID : "*) uuid=${line#UUID : } ;;
      "Active Devices : "*) active=${line#Active Devices : } ;;
      "Raid Devices : "*) total=${line#Raid Devices : } ;;
    esac
  done <<<"$detail"
  array_health "$rc" "$state"
  health=$ARRAY_HEALTH
  while IFS= read -r line; do
    [[ $line != UUID=* ]] || fs_uuid=${line#UUID=}
  done < <(blkid -p -o export -- "$md" 2>/dev/null || true)
  real=$(readlink -f -- "$md")
  if [[ $(findmnt -rn -o SOURCE --mountpoint "$GS_MOUNTPOINT" || true) == "$real" ]]; then
    mounted=true
    bytes=$(df -B1 --output=size "$GS_MOUNTPOINT" | tail -n1)
    bytes=${bytes// /}
  fi
fi
json_str mp "$GS_MOUNTPOINT"
printf '{"step":"health","result":"unchanged","device":"%s","health":"%s","state":"%s","activeDevices":%s,"raidDevices":%s,"arrayUuid":"%s","filesystemUuid":"%s","mountpoint":%s,"mounted":%s,"usableBytes":%s}\n' \
  "$md" "$health" "$state" "$active" "$total" "$uuid" "$fs_uuid" "$mp" "$mounted" "$bytes"
