#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/60-grow.sh, rendered by components/node.py
# ---- lib.sh
# Helpers shared by the node steps. components/node.py renders every step as:
#   shebang + `set -euo pipefail` + quoted GS_* parameters + this file + the step body,
# leaving out the functions the step never calls (by name, directly or through another function;
# every line outside a function stays): so call a helper by its literal name, and end a
# multi-line function with `}` alone on a line.
# Functions, and the ERR trap below: loading this file changes nothing else. Each process start
# is slow on a busy node (and ~30 ms in the test VM), so the helpers read sysfs and use bash
# builtins where they can instead of forking tools.

# shellcheck disable=SC2034  # read by the steps
MIB=1048576

say() { printf '%s\n' "$*"; }
die() {
  printf 'ERROR: %s\n' "$*" >&2
  exit 1
}

# A command that fails where no check expects it ends the step under `set -e` with only its own
# words, or none (a killed one): say which, in one ERROR line. errtrace carries the trap into
# functions. Only the step's own shell speaks: a subshell's failure reaches it as its exit status.
# The command's text is the script's (no expanded values), so it holds no configuration.
on_error() {
  [[ $BASHPID == "$$" ]] || return 0
  local text=${BASH_COMMAND//$'\n'/ }
  ((${#text} <= 100)) || text="${text:0:100}…"
  printf "ERROR: '%s' failed (exit %s, line %s of this step); its own message, if any, is above. Fix that, then run pulumi up again\n" "$text" "$1" "$2" >&2
  exit "$1"
}
set -E
trap 'on_error $? $LINENO' ERR

need_root() {
  ((EUID == 0)) || die "the node steps need root; set the node's ssh.user to root"
}

# need_tools TOOL...: dies naming every missing tool and how to install it.
need_tools() {
  local tool missing=()
  for tool in "$@"; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  ((${#missing[@]} == 0)) || die "missing tools: ${missing[*]}. Install them (Debian/Ubuntu: apt-get install -y parted mdadm xfsprogs util-linux udev; RHEL/Rocky: dnf install -y parted mdadm xfsprogs util-linux systemd-udev) and run pulumi up again"
}


# resolve_disk PATH: sets DISK_DEV (/dev/sdX) and DISK_BASE (sdX); dies unless PATH is a plain whole
# disk: not a partition, not a device-mapper/md/loop device, and not held by anything (multipath,
# LVM, a whole-disk RAID, dm-crypt), since writing a GPT under a holder corrupts what it holds.
# shellcheck disable=SC2034  # DISK_* are read by the steps
resolve_disk() {
  local path=$1 holder holders=""
  [[ -b $path ]] || die "$path is not a block device on this node; check nodes[].storage.disks (stable names: ls -l /dev/disk/by-id)"
  DISK_DEV=$(readlink -f -- "$path")
  DISK_BASE=${DISK_DEV##*/}
  [[ ! -e /sys/class/block/$DISK_BASE/partition ]] || die "$path is a partition ($DISK_DEV); list whole disks in storage.disks, this program creates the partition itself"
  case $DISK_BASE in
    dm-* | md* | loop*) die "$path ($DISK_DEV) is a device-mapper, md or loop device, not a plain disk; list the physical disks (ls -l /dev/disk/by-id)" ;;
  esac
  [[ -d /sys/block/$DISK_BASE ]] || die "$path ($DISK_DEV) is not a whole disk"
  for holder in /sys/block/"$DISK_BASE"/holders/*; do
    [[ -e $holder ]] && holders+=" ${holder##*/}"
  done
  [[ -z $holders ]] || die "$path ($DISK_DEV) is in use by${holders} (multipath, LVM, a whole-disk RAID or dm-crypt); not touching it. See 'lsblk $DISK_DEV' and list a disk nothing holds"
  hold_disk
}

# hold_disk: a shared BSD lock on DISK_DEV until the step exits (systemd's block device locking).
# When any tool closes a disk it opened for writing (our own parted in the partition step, an
# operator's), udev re-reads its partition table, and the re-read removes and re-adds every partition
# node of the disk: a probe or an mdadm in that moment finds no partition. udev does not re-read a
# disk someone holds a lock on, and a re-read already running ends before the lock is granted, so the
# partitions stay put while the step works (until the array is assembled, when they are busy anyway).
hold_disk() {
  local fd
  exec {fd}<"$DISK_DEV"
  flock -s -w 60 "$fd" || die "$DISK_DEV has been locked for writing by another program for 60 s (a partitioning tool: see 'fuser -v $DISK_DEV'); wait for it to finish and run pulumi up again"
}

# node_lock STEP: one step at a time per machine (a second pulumi up, or two nodes[] entries naming
# the same machine, would otherwise race parted on one GPT). Every step calls it first; the lock is
# released when the step's shell exits. It lives in a root-only folder: in the world-writable
# /run/lock any local user could hold it, or pre-create it so that opening it fails. The wait is
# the longest a step may run (components/node.py TIMEOUTS, 30m); GS_LOCK_WAIT overrides it.
LOCK_DIR=/run/gpu-serving
node_lock() {
  local lock=$LOCK_DIR/lock holder=$LOCK_DIR/holder wait=${GS_LOCK_WAIT:-1800} owner mode pid="" who=""
  [[ -e $LOCK_DIR || -L $LOCK_DIR ]] || mkdir -m 0700 "$LOCK_DIR" 2>/dev/null || true
  [[ -d $LOCK_DIR && ! -L $LOCK_DIR ]] || die "$LOCK_DIR is not a folder; remove it ('rm -f $LOCK_DIR') and run pulumi up again"
  read -r owner mode < <(stat -c '%u %a' "$LOCK_DIR")
  # Root's and writable by root only (earlier versions made it 755 for the runtime step's marker).
  ((owner == 0 && (8#$mode & 8#022) == 0)) || die "$LOCK_DIR (the node steps' lock folder) is owned by uid $owner with mode $mode, not by root and writable by root only; someone else made it. Check it, then 'rm -rf $LOCK_DIR' and run pulumi up again"
  [[ $mode == 700 ]] || chmod 0700 "$LOCK_DIR"
  { exec 9>>"$lock"; } 2>/dev/null || die "cannot open the node lock $lock; remove it ('rm -rf $lock') and run pulumi up again"
  if ! flock -w "$wait" 9; then
    # The holder file names the last step that took the lock: believed only while its pid lives.
    { read -r pid who <"$holder"; } 2>/dev/null || true
    [[ -n ${pid:-} && -d /proc/$pid ]] || who="not a node step"
    die "another gpu-serving step (${who}) has held $lock on this node for ${wait}s (a second pulumi up, or two nodes[] entries for this machine); see 'fuser -v $lock', wait for it to finish and run pulumi up again"
  fi
  printf '%s %s, pid %s, since %(%F %T)T\n' "$$" "${1:-a step}" "$$" -1 >"$holder"
}




# scan_disk DEV NAME: reads DEV's partition table (`parted -m unit B print free`). Sets
#   SCAN_LABEL   gpt, msdos, unknown (no label), ...     SCAN_BYTES  disk size
#   SCAN_LAST_END  last byte of the last partition (-1: no partitions)
#   TAIL_START/TAIL_END  the largest free region after the last partition (-1: none)
#   PART_NUM PART_START PART_END PART_FLAGS  the partition named NAME (PART_NUM="" if none)
#   PART_COUNT   how many partitions are named NAME
#   AFTER_END    last byte of the free region right after partition NAME (= PART_END if none)
#   SCAN_OTHERS  "num:start:end:name" of every partition not named NAME (space-separated)
# Dies with parted's own message when parted fails for any reason but a missing label, and when the
# GPT's backup header is not at the end of the disk (a grown LUN: parted shows the new space as
# free, but mkpart then refuses it).
# shellcheck disable=SC2034  # SCAN_*, TAIL_*, PART_*, AFTER_END are read by the steps
scan_disk() {
  local dev=$1 name=$2 out line num start end size fs pname flags free rc=0 err=""
  local -a frees=()
  out=$(LC_ALL=C parted -m -s "$dev" unit B print free 2>&1) || rc=$?
  SCAN_LABEL=unknown SCAN_BYTES=0 SCAN_LAST_END=-1 TAIL_START=-1 TAIL_END=-1 SCAN_OTHERS=""
  PART_NUM="" PART_START=0 PART_END=0 PART_FLAGS="" PART_COUNT=0 AFTER_END=0
  while IFS= read -r line; do
    line=${line%;}
    case $line in
      "" | BYT) continue ;;
      /*)
        IFS=: read -r _ size _ _ _ SCAN_LABEL _ <<<"$line"
        SCAN_BYTES=${size%B}
        continue
        ;;
      [0-9]*:*) ;;
      *)
        err+="${err:+ }$line"
        continue
        ;;
    esac
    IFS=: read -r num start end size fs pname flags <<<"$line"
    start=${start%B} end=${end%B}
    if [[ $fs == free ]]; then
      frees+=("$start:$end")
      continue
    fi
    ((end > SCAN_LAST_END)) && SCAN_LAST_END=$end
    [[ $pname == "$name" ]] || SCAN_OTHERS+="${SCAN_OTHERS:+ }$num:$start:$end:$pname"
    if [[ $pname == "$name" ]]; then
      PART_COUNT=$((PART_COUNT + 1))
      PART_NUM=$num PART_START=$start PART_END=$end PART_FLAGS=$flags
    fi
  done <<<"$out"
  AFTER_END=$PART_END
  for free in "${frees[@]}"; do
    start=${free%%:*} end=${free##*:}
    if ((start > SCAN_LAST_END && end - start > TAIL_END - TAIL_START)); then
      TAIL_START=$start TAIL_END=$end
    fi
    if [[ -n $PART_NUM ]] && ((start == PART_END + 1)); then
      AFTER_END=$end
    fi
  done
  # parted also reports a damaged table ("Error: The backup GPT table is corrupt ...") with exit 0.
  if [[ ($rc != 0 || $err == *Error:*) && ! ($SCAN_LABEL == unknown && $err == *"unrecognised disk label"*) ]]; then
    die "parted cannot read $dev: ${err:-exit $rc}"
  fi
  if [[ $err == *"Not all of the space available"* ]]; then
    die "$dev has grown since its GPT was written: the backup GPT header is not at the end of the disk, so the new space cannot be partitioned yet. Move the backup header with 'sgdisk -e $dev' (it changes nothing else), then run pulumi up again"
  fi
  return 0
}

# size_gb_for BYTES: SIZE_GB becomes the smallest storage.sizeGb whose partition holds BYTES, as the
# config computes it (stacks/config/nodes.py size_gb_for: GB rounded down to whole MiB), so a refusal
# never suggests a size that is itself refused.
# shellcheck disable=SC2034  # SIZE_GB is read by the steps
size_gb_for() {
  SIZE_GB=$((($1 + 999999999) / 1000000000))
  ((SIZE_GB >= 1)) || SIZE_GB=1
  while ((SIZE_GB * 1000000000 / MIB * MIB < $1)); do
    SIZE_GB=$((SIZE_GB + 1))
  done
}


# part_dev BASE NUM: PART_DEV becomes /dev/<kernel name> of partition NUM of disk BASE ("" if the
# kernel does not know it yet).
# shellcheck disable=SC2034  # PART_DEV is read by the steps
part_dev() {
  local base=$1 num=$2 dir n
  PART_DEV=""
  for dir in /sys/class/block/"$base"/"$base"*/; do
    # A partition can vanish between the glob and the read while the kernel re-reads the table.
    { read -r n <"${dir}partition"; } 2>/dev/null || continue
    if [[ $n == "$num" ]]; then
      dir=${dir%/}
      PART_DEV=/dev/${dir##*/}
      return 0
    fi
  done
}

# settle: let udev finish pending events first. Closing a disk or partition after a write makes
# udev re-read that disk's partition table, and during the re-read its partitions briefly vanish.
settle() {
  udevadm settle --timeout=30 || true
}

# find_part BASE NUM: part_dev, retried for a few seconds while udev re-reads the table.
find_part() {
  local _
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    part_dev "$1" "$2"
    [[ -z $PART_DEV || ! -b $PART_DEV ]] || return 0
    settle
    sleep 0.5
  done
  PART_DEV=""
}

















# ---- 60-grow.sh
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
