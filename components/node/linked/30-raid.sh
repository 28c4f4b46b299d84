#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/30-raid.sh, rendered by components/node.py
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

# wait_node DEV: true once DEV is a block device (for up to ~5 s, udev settled between looks).
wait_node() {
  local _
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    [[ ! -b $1 ]] || return 0
    settle
    sleep 0.5
  done
  return 1
}

# probe_part PART CMD...: PROBED becomes CMD's output. hold_disk keeps udev from re-reading the
# partition table under a probe; a re-read it cannot stop (`blockdev --rereadpt` or a udev that takes
# no lock) still removes and re-adds the partition nodes, and a probe in that moment fails on a healthy
# partition with "No such file or directory". So wait for the node and try again; the third failure
# is CMD's own, with its message on stderr.
probe_part() {
  local part=$1 _
  shift
  for _ in 1 2; do
    wait_node "$part" || true
    if PROBED=$("$@" 2>/dev/null); then return 0; fi
    settle
  done
  wait_node "$part" || true
  PROBED=$("$@")
}

# examine PART: what PART holds. SB_KIND: none | ours (an md member named GS_RAID_NAME) | foreign.
# SB_UUID: the array UUID of our member. SB_DESC: what was found, for messages.
# shellcheck disable=SC2034  # SB_* are read by the steps
examine() {
  local part=$1 sigs line md_name="" md_uuid="" md_level=""
  SB_KIND=none SB_UUID="" SB_DESC=""
  probe_part "$part" wipefs -n --noheadings --output TYPE -- "$part" || die "wipefs cannot read $part"
  sigs=${PROBED//$'\n'/ }
  [[ -n $sigs ]] || return 0
  SB_DESC=$sigs
  if [[ $sigs != linux_raid_member ]]; then
    SB_KIND=foreign
    return 0
  fi
  probe_part "$part" mdadm --examine --export "$part" 2>/dev/null || PROBED=""
  while IFS= read -r line; do
    case $line in
      MD_NAME=*) md_name=${line#MD_NAME=} ;;
      MD_UUID=*) md_uuid=${line#MD_UUID=} ;;
      MD_LEVEL=*) md_level=${line#MD_LEVEL=} ;;
    esac
  done <<<"$PROBED"
  SB_DESC="md member of array '$md_name' ($md_level, UUID $md_uuid)"
  conf_uuid
  # Ours: built by us (named GS_RAID_NAME), or adopted (mdadm.conf lists it as /dev/md/GS_RAID_NAME).
  if [[ (${md_name##*:} == "$GS_RAID_NAME" || $md_uuid == "$CONF_UUID") && $md_level == raid1 && -n $md_uuid ]]; then
    SB_KIND=ours SB_UUID=$md_uuid
  else
    SB_KIND=foreign
  fi
}

# conf_uuid: CONF_UUID becomes the UUID of the mdadm.conf ARRAY line for /dev/md/GS_RAID_NAME ("" if none).
conf_uuid() {
  local word dev rest
  CONF_UUID=""
  mdadm_conf
  [[ -r $MDADM_CONF ]] || return 0
  while read -r word dev rest || [[ -n $word ]]; do
    [[ $word == ARRAY && $dev == "/dev/md/$GS_RAID_NAME" && " $rest " == *" UUID="* ]] || continue
    CONF_UUID=${rest#*UUID=}
    CONF_UUID=${CONF_UUID%% *}
  done <"$MDADM_CONF"
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

# adopt_record: the adopted array becomes ours under /dev/md/GS_RAID_NAME, with no downtime: its
# mdadm.conf ARRAY lines (by UUID) become one line naming /dev/md/GS_RAID_NAME (so every later
# assembly, at boot too, uses our name), and the running array gets that name now through mdadm's
# map file and a udev change event. Its superblock name (e.g. host:1) is left as it is. Sets
# ADOPT_CHANGED=1 when it changed anything.
# shellcheck disable=SC2034  # ADOPT_CHANGED is read by the steps
adopt_record() {
  local want="ARRAY /dev/md/$GS_RAID_NAME metadata=$ADOPT_META UUID=$ADOPT_UUID" line word dev rest text keep=() have=0 dropped=0
  ADOPT_CHANGED=0
  mdadm_conf
  if [[ -r $MDADM_CONF ]]; then
    while IFS= read -r line || [[ -n $line ]]; do
      read -r word dev rest <<<"$line"
      if [[ $word == ARRAY && " $rest " == *" UUID=$ADOPT_UUID "* ]]; then
        if [[ $line == "$want" ]] && ((have == 0)); then
          have=1
          keep+=("$line")
        else
          say "adopting $GS_ADOPT: replacing the $MDADM_CONF line: $line"
          dropped=1
        fi
        continue
      fi
      keep+=("$line")
    done <"$MDADM_CONF"
  fi
  if ((have == 0 || dropped)); then
    ((have == 1)) || keep+=("$want")
    say "adopting $GS_ADOPT: $MDADM_CONF now says: $want"
    mkdir -p "${MDADM_CONF%/*}"
    printf -v text '%s\n' "${keep[@]}"
    write_atomic "$MDADM_CONF" 644 "$text"
    ADOPT_CHANGED=1
  fi
  if [[ $(readlink -f "/dev/md/$GS_RAID_NAME" 2>/dev/null) != "/dev/$ADOPT_DEV" ]]; then
    [[ ! -e /dev/md/$GS_RAID_NAME ]] || die "/dev/md/$GS_RAID_NAME already names another array; choose another storage.raidName"
    say "adopting $GS_ADOPT: naming the running array /dev/md/$GS_RAID_NAME"
    name_running "$ADOPT_DEV" "$ADOPT_UUID" "$ADOPT_META"
    [[ -b /dev/md/$GS_RAID_NAME ]] || die "udev did not create /dev/md/$GS_RAID_NAME for the adopted $GS_ADOPT; $MDADM_CONF names it, so it appears after a reboot; run pulumi up again then"
    ADOPT_CHANGED=1
  fi
}

# name_running DEV UUID META: the running array DEV (md127) becomes /dev/md/GS_RAID_NAME now, with
# no stop and no unmount, through mdadm's map file and a udev change event (udev names md devices
# from the map). UUID as `mdadm --detail` prints it; META its metadata version.
name_running() {
  local dev=$1 uuid="" word meta muuid rest keep=() map=/run/mdadm/map
  mkdir -p "${map%/*}"
  touch "$map"
  # The map holds the UUID as mdadm stores it in memory (each 32-bit word byte-swapped against
  # `mdadm --detail`); mdadm ignores an entry whose UUID does not match. Keep the entry's own.
  for word in ${2//:/ }; do
    uuid+="${uuid:+:}${word:6:2}${word:4:2}${word:2:2}${word:0:2}"
  done
  while read -r word meta muuid rest; do
    if [[ $word == "$dev" ]]; then
      uuid=$muuid
    else
      keep+=("$word $meta $muuid $rest")
    fi
  done <"$map"
  keep+=("$dev $3 $uuid /dev/md/$GS_RAID_NAME")
  printf '%s\n' "${keep[@]}" >"$map"
  udevadm trigger --action=change "/dev/$dev"
  udevadm settle --timeout=30 || true
}

# md_of PART: MD_OF becomes the md device (md127) that holds PART, "" if none.
# shellcheck disable=SC2034  # MD_OF is read by the steps
md_of() {
  local holder
  MD_OF=""
  for holder in /sys/class/block/"${1##*/}"/holders/md*; do
    [[ -e $holder ]] && MD_OF=${holder##*/}
  done
  return 0
}

# array_health RC STATE: ARRAY_HEALTH becomes the array's health from the exit code of `mdadm --detail
# --test` and its `State :` text: clean, resyncing, degraded, failed or unknown. A rebuild onto a
# replaced or re-added member ("clean, degraded, recovering") is resyncing, not degraded: mdadm counts
# the member being rebuilt as missing until it is in sync, but nothing is left for the operator to
# do (a degraded array asks them to replace a disk).
# shellcheck disable=SC2034  # ARRAY_HEALTH is read by the steps
array_health() {
  case $1 in
    0) ARRAY_HEALTH=clean ;;
    1) ARRAY_HEALTH=degraded ;;
    2) ARRAY_HEALTH=failed ;;
    *) ARRAY_HEALTH=unknown ;;
  esac
  if [[ $ARRAY_HEALTH == clean && ($2 == *resync* || $2 == *recover*) || $ARRAY_HEALTH == degraded && $2 == *recover* ]]; then
    ARRAY_HEALTH=resyncing
  fi
}

# block_size BASE: BLOCK_SIZE becomes the logical sector size of disk or partition BASE (sdb, sdb5, md127).
# shellcheck disable=SC2034  # BLOCK_SIZE is read by the steps
block_size() {
  local dir=/sys/class/block/$1
  [[ -e $dir/queue ]] || dir=$dir/..
  read -r BLOCK_SIZE <"$dir/queue/logical_block_size"
}

# mdadm_conf: MDADM_CONF becomes the distro's mdadm.conf path.
# shellcheck disable=SC2034  # MDADM_CONF is read by the steps
mdadm_conf() {
  if [[ -d /etc/mdadm ]]; then
    MDADM_CONF=/etc/mdadm/mdadm.conf # Debian, Ubuntu
  else
    MDADM_CONF=/etc/mdadm.conf # RHEL, Rocky, Fedora, SUSE
  fi
}




# write_atomic PATH MODE TEXT: replace PATH by TEXT (written as is) so that a crash at any moment
# leaves the old file or the new one, never an empty one: the new file reaches the disk before
# the rename, and the rename before we go on (XFS may commit a rename ahead of the data, and an
# empty /etc/fstab boots into emergency mode). `sync FILE` is fsync(2) (coreutils >= 8.24).
write_atomic() {
  local path=$1 mode=$2 tmp
  tmp=${path%/*}/.${path##*/}.gpu-serving
  printf '%s' "$3" >"$tmp"
  chmod "$mode" "$tmp"
  sync -- "$tmp"
  mv -f -- "$tmp" "$path"
  sync -- "${path%/*}"
}

# ---- 30-raid.sh
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
