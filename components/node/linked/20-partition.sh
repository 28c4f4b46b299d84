#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/20-partition.sh, rendered by components/node.py
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
warn() { printf 'WARNING: %s\n' "$*" >&2; }
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


# overlaps SPANS START END: true when a "num:start:end:name" of SPANS overlaps bytes START-END;
# OVERLAP is the first one.
# shellcheck disable=SC2034  # OVERLAP is read by the steps
overlaps() {
  local span s e
  OVERLAP=""
  for span in $1; do
    IFS=: read -r _ s e _ <<<"$span"
    if ((s <= $3 && e >= $2)); then
      OVERLAP=$span
      return 0
    fi
  done
  return 1
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


# wait_part BASE NUM DEV: tell the kernel about DEV's partitions and wait for partition NUM.
wait_part() {
  local base=$1 num=$2 dev=$3 i
  part_dev "$base" "$num"
  [[ -z $PART_DEV || ! -b $PART_DEV ]] || return 0
  if [[ -z $PART_DEV ]]; then
    partx -u "$dev" 2>/dev/null || partprobe "$dev" 2>/dev/null || true
  fi
  for i in {1..20}; do
    udevadm settle --timeout=10 || true
    part_dev "$base" "$num"
    [[ -n $PART_DEV && -b $PART_DEV ]] && return 0
    ((i % 5 == 0)) && partx -a "$dev" 2>/dev/null || true
    sleep 0.5
  done
  die "the kernel does not show partition $num of $dev; run 'partprobe $dev' (a reboot helps if a partition of it is busy) and pulumi up again"
}





# adopt_check: GS_ADOPT (an array built by other tooling, e.g. the Ansible role's /dev/md1) must be
# a running two-member RAID1 of one partition on each of GS_DISKS, carrying XFS. Sets ADOPT_DEV
# (md1), ADOPT_UUID, ADOPT_META (1.2), ADOPT_FS_UUID and ADOPT_PARTS (partition kernel names, in GS_DISKS order).
# shellcheck disable=SC2034  # ADOPT_* are read by the steps
adopt_check() {
  local md=$GS_ADOPT real base level raid_disks state slave s found line all="" fstype=""
  [[ -b $md ]] || die "storage.adopt: $md is not a block device on this node; check 'cat /proc/mdstat' for the array to adopt"
  real=$(readlink -f -- "$md")
  base=${real##*/}
  [[ -d /sys/block/$base/md ]] || die "storage.adopt: $md ($real) is not an md array"
  read -r level <"/sys/block/$base/md/level"
  read -r raid_disks <"/sys/block/$base/md/raid_disks"
  read -r state <"/sys/block/$base/md/array_state"
  [[ $level == raid1 && $raid_disks == 2 ]] || die "storage.adopt: $md is $level with $raid_disks members; only a two-member RAID1 can be adopted"
  [[ $state != inactive && $state != clear ]] || die "storage.adopt: $md is not running ($state); assemble it first ('mdadm --assemble --scan')"
  for slave in /sys/block/"$base"/slaves/*; do
    [[ -e $slave ]] && all+=" ${slave##*/}"
  done
  ADOPT_PARTS=()
  for line in "${GS_DISKS[@]}"; do
    resolve_disk "$line"
    found=""
    for s in $all; do
      [[ -e /sys/class/block/$s/partition && -e /sys/block/$DISK_BASE/$s ]] && found=$s
    done
    [[ -n $found ]] || die "storage.adopt: $md has no member on $line (its members:${all:- none}); adopt only an array of one partition on each of storage.disks, and a degraded one only after it is repaired"
    ADOPT_PARTS+=("$found")
  done
  ADOPT_UUID="" ADOPT_META=""
  while IFS= read -r line; do
    case $line in
      MD_UUID=*) ADOPT_UUID=${line#MD_UUID=} ;;
      MD_METADATA=*) ADOPT_META=${line#MD_METADATA=} ;;
    esac
  done < <(mdadm --detail --export "$real")
  [[ -n $ADOPT_UUID ]] || die "storage.adopt: mdadm shows no UUID for $md"
  # 1.0 and 0.90 keep the superblock at the end of each member: a grown partition leaves it behind,
  # and the filesystem at the member's start makes every member look like a foreign XFS.
  [[ $ADOPT_META == 1.[12] ]] || die "storage.adopt: $md has metadata ${ADOPT_META:-unknown} (superblock at the end of each member), which this program cannot grow or check; only a metadata 1.1 or 1.2 array (mdadm's default) can be adopted. Leave storage.adopt out and keep this array as it is, or copy the models onto an array this program builds"
  ADOPT_FS_UUID=""
  while IFS= read -r line; do
    case $line in
      TYPE=*) fstype=${line#TYPE=} ;;
      UUID=*) ADOPT_FS_UUID=${line#UUID=} ;;
    esac
  done < <(blkid -p -o export -- "$real" || true)
  [[ $fstype == xfs ]] || die "storage.adopt: $md carries ${fstype:-no filesystem blkid recognises}, not XFS; only an XFS array can be adopted (grow needs xfs_growfs)"
  ADOPT_DEV=$base
}











# ---- 20-partition.sh
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
