#!/usr/bin/env bash
set -euo pipefail
# Step 50, mount: the array's XFS in /etc/fstab by filesystem UUID, then mounted.
# The fstab line is added once and replaced (never duplicated) when its options or mountpoint
# change; a line of another device for our mountpoint is refused. nofail keeps a missing array
# from blocking boot; x-systemd.before=kubelet.service orders the mount before kubelet. Before
# the first mount the empty mountpoint directory is made immutable (chattr +i), so if the array
# is ever missing at boot nothing can write model files onto the root filesystem beneath it.
: "${GS_RAID_NAME:?}" "${GS_MOUNTPOINT:?}" "${GS_DEVICE_TIMEOUT:?}"

need_root
need_tools blkid findmnt mount
md=/dev/md/$GS_RAID_NAME
[[ -b $md ]] || die "$md does not exist; the raid step (30) must run first"
real=$(readlink -f -- "$md")
uuid=""
while IFS= read -r line; do
  [[ $line != UUID=* ]] || uuid=${line#UUID=}
done < <(blkid -p -o export -- "$md" || true)
[[ -n $uuid ]] || die "$md has no filesystem UUID; the filesystem step (40) must run first"

# fstab escapes blanks and backslashes in paths as octal.
mp=${GS_MOUNTPOINT//\\/\\134}
mp=${mp// /\\040}
mp=${mp//$'\t'/\\011}
want="UUID=$uuid $mp xfs noatime,nofail,x-systemd.device-timeout=${GS_DEVICE_TIMEOUT}s,x-systemd.before=kubelet.service 0 0"

changed=0 found=0 lines=()
if [[ -e /etc/fstab ]]; then
  while IFS= read -r line || [[ -n $line ]]; do
    read -r source target _ <<<"$line"
    if [[ $source == "UUID=$uuid" || $source == "$md" || $source == "$real" ]]; then
      if [[ $line == "$want" ]] && ((found == 0)); then
        found=1
        lines+=("$line")
      else
        say "replacing the fstab line: $line"
        changed=1
      fi
      continue
    fi
    if [[ $source != \#* && $target == "$mp" ]]; then
      die "/etc/fstab already mounts $source at $GS_MOUNTPOINT; remove that line or choose another storage.mountpoint"
    fi
    lines+=("$line")
  done </etc/fstab
fi
if ((found == 0)); then
  lines+=("$want")
  changed=1
fi
if ((changed)); then
  say "writing /etc/fstab: $want"
  tmp=/etc/.fstab.gpu-serving
  printf '%s\n' "${lines[@]}" >"$tmp"
  chmod 644 "$tmp"
  mv -f "$tmp" /etc/fstab
  [[ ! -d /run/systemd/system ]] || systemctl daemon-reload
else
  say "/etc/fstab line present, unchanged"
fi

# Mounted elsewhere (the mountpoint changed in config)? Move it.
while read -r target; do
  [[ -n $target && $target != "$GS_MOUNTPOINT" ]] || continue
  say "unmounting the old mountpoint $target"
  umount "$target" || die "cannot unmount $target (in use?); stop the pods using it, then run pulumi up again"
  changed=1
done < <(findmnt -rn -o TARGET --source "$real" || true)

current=$(findmnt -rn -o SOURCE --mountpoint "$GS_MOUNTPOINT" || true)
if [[ -z $current ]]; then
  if [[ ! -d $GS_MOUNTPOINT ]]; then
    say "creating $GS_MOUNTPOINT"
    mkdir -p -- "$GS_MOUNTPOINT"
  fi
  shopt -s nullglob dotglob
  hidden=("$GS_MOUNTPOINT"/*)
  shopt -u nullglob dotglob
  if ((${#hidden[@]})); then
    warn "$GS_MOUNTPOINT is not empty (${#hidden[@]} entries on the root filesystem); they stay there, hidden under the mount"
  elif command -v chattr >/dev/null; then
    chattr +i -- "$GS_MOUNTPOINT" 2>/dev/null || warn "cannot make $GS_MOUNTPOINT immutable (chattr +i)"
  fi
  say "mounting $GS_MOUNTPOINT"
  mount -- "$GS_MOUNTPOINT"
  changed=1
elif [[ $current != "$real" ]]; then
  die "$current is mounted at $GS_MOUNTPOINT, not our array $md; unmount it or choose another storage.mountpoint"
else
  say "$GS_MOUNTPOINT is mounted, unchanged"
fi

result=unchanged
((changed == 0)) || result=changed
j=""
json_str j "$GS_MOUNTPOINT"
printf '{"step":"mount","result":"%s","mountpoint":%s,"uuid":"%s","device":"%s"}\n' "$result" "$j" "$uuid" "$md"
