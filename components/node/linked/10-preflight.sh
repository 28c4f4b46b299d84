#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/10-preflight.sh, rendered by components/node.py
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

# json_str VAR VALUE: VAR becomes VALUE as a JSON string literal.
json_str() {
  local s=${2//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/\\t}
  printf -v "$1" '"%s"' "$s"
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


# fstab_unescape FIELD: UNESCAPED becomes FIELD as libmount reads it: each backslash followed by three
# octal digits is that byte (fstab writes a blank as \040, but any byte may be written so: \155 is
# "m"); any other backslash stays.
fstab_unescape() {
  local s=$1 c
  UNESCAPED=""
  while [[ $s == *\\* ]]; do
    UNESCAPED+=${s%%\\*}
    s=${s#*\\}
    if [[ $s == [0-7][0-7][0-7]* ]]; then
      printf -v c %b "\\0${s:0:3}"
      UNESCAPED+=$c
      s=${s:3}
    else
      UNESCAPED+=\\
    fi
  done
  UNESCAPED+=$s
}

# fstab_paths: reads /etc/fstab. FSTAB_LINES holds its lines, FSTAB_SOURCES and FSTAB_TARGETS their
# first two fields as written, FSTAB_PATHS the directory each target names: decoded and canonical
# (`readlink -m`: symlinks resolved, `.`, `..`, doubled and trailing slashes gone), as mount(8) and
# systemd's fstab generator find a line for a path; "" for comments, blank lines and targets that are
# no path (swap, none). MP_PATH is GS_MOUNTPOINT made canonical the same way. So `/mnt/models/`,
# `/mnt//models`, `/mnt/./models`, `/mnt/\155odels` or a path through a symlink are all /mnt/models.
# shellcheck disable=SC2034  # FSTAB_*, MP_PATH are read by the steps
fstab_paths() {
  local line source target i=0 p paths=() at=() out=()
  FSTAB_LINES=() FSTAB_SOURCES=() FSTAB_TARGETS=() FSTAB_PATHS=()
  if [[ -e /etc/fstab ]]; then
    while IFS= read -r line || [[ -n $line ]]; do
      source="" target=""
      read -r source target _ <<<"$line"
      FSTAB_LINES+=("$line") FSTAB_SOURCES+=("$source") FSTAB_TARGETS+=("$target") FSTAB_PATHS+=("")
      if [[ $source != \#* && $target == /* ]]; then
        fstab_unescape "$target"
        paths+=("$UNESCAPED") at+=("$i")
      fi
      i=$((i + 1))
    done </etc/fstab
  fi
  # One readlink for all (NUL-separated: a decoded path may hold a newline). It leaves out a path it
  # cannot resolve (a symlink loop): then each on its own, such a path kept as written.
  mapfile -d '' -t out < <(readlink -m -z -- "$GS_MOUNTPOINT" "${paths[@]}" 2>/dev/null || true)
  if ((${#out[@]} != ${#paths[@]} + 1)); then
    out=()
    for p in "$GS_MOUNTPOINT" "${paths[@]}"; do
      out+=("$(readlink -m -- "$p" 2>/dev/null || printf '%s' "$p")")
    done
  fi
  MP_PATH=${out[0]}
  for i in "${!at[@]}"; do
    FSTAB_PATHS[at[i]]=${out[i + 1]}
  done
}


# ---- 10-preflight.sh
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
