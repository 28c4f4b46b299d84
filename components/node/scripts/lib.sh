#!/usr/bin/env bash
set -euo pipefail
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

# unit_state UNIT: UNIT_STATE becomes UNIT's "ActiveState (SubState)", as `systemctl status` shows
# them; UNIT_RUNNING 1 when it is active, reloading or activating (starting, or waiting to restart).
# shellcheck disable=SC2034  # UNIT_RUNNING is read by the steps
unit_state() {
  local line active="" sub=""
  while IFS= read -r line; do
    case $line in
      ActiveState=*) active=${line#*=} ;;
      SubState=*) sub=${line#*=} ;;
    esac
  done < <(systemctl show -p ActiveState -p SubState -- "$1" 2>/dev/null || true)
  UNIT_STATE="${active:-unknown}${sub:+ ($sub)}"
  case $active in
    active | reloading | activating) UNIT_RUNNING=1 ;;
    *) UNIT_RUNNING=0 ;;
  esac
}

# restart_unit UNIT SECONDS: `systemctl restart UNIT`, waiting at most SECONDS (GS_UNIT_WAIT
# overrides it) for the unit to be up again. A plain restart waits until the start job ends, and a
# Type=notify unit ends it only when its daemon sends READY=1: under TimeoutStartSec=0 (k3s's and
# rke2's units, or any unit a drop-in gives no start timeout) a daemon that never does, such as a
# k3s agent that cannot reach its server, would hold this step, `pulumi up` and every step waiting
# on the node lock forever. `timeout` ends only the wait: systemd goes on with the job. False unless
# the unit came up in time; UNIT_WAIT is the bound, UNIT_STATE the unit's state afterwards and
# UNIT_ERROR the first line systemctl printed (a unit that failed, is masked or missing).
# shellcheck disable=SC2034  # UNIT_WAIT and UNIT_ERROR are read by the steps
restart_unit() {
  local rc=0
  UNIT_WAIT=${GS_UNIT_WAIT:-$2}
  UNIT_ERROR=$(timeout -k 5 "$UNIT_WAIT" systemctl restart -- "$1" 2>&1 >/dev/null) || rc=$?
  UNIT_ERROR=${UNIT_ERROR%%$'\n'*}
  unit_state "$1"
  ((rc == 0))
}

# cri_up: containerd answers (within 60 s of a restart) and its CRI plugin (what the kubelet talks
# to) loaded. `containerd config dump` does not start the CRI: a configuration it accepts can still
# leave containerd active with no CRI (a default runtime that is not configured) and the node
# NotReady. CRI_STATUS says what `ctr plugins ls` showed. Without ctr it cannot tell: true, warned.
cri_up() {
  local i out type id status found
  if ! command -v ctr >/dev/null; then
    warn "no ctr on this node: cannot check that containerd's CRI plugin came up after the restart"
    return 0
  fi
  CRI_STATUS="containerd did not answer"
  for i in {1..60}; do
    if out=$(ctr plugins ls 2>/dev/null); then
      found=0 CRI_STATUS=""
      while read -r type id _ status; do
        # 1.x: io.containerd.grpc.v1 cri; 2.x adds io.containerd.cri.v1 images and runtime.
        [[ ($type == io.containerd.grpc.v1 && $id == cri) || $type == io.containerd.cri.v1 ]] || continue
        found=1
        [[ $status == ok ]] || CRI_STATUS+="${CRI_STATUS:+, }$type $id: $status"
      done <<<"$out"
      [[ -n $CRI_STATUS ]] && return 1 # a plugin that failed to load stays so until a restart
      ((found)) && return 0
      CRI_STATUS="no CRI plugin listed"
    fi
    ((i % 10)) || say "waiting for containerd's CRI plugin ($CRI_STATUS)"
    sleep 1
  done
  return 1
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

# array_uuid DEV: prints the UUID of the running array DEV, nothing when mdadm shows none.
array_uuid() {
  mdadm --detail --export "$1" 2>/dev/null | sed -n 's/^MD_UUID=//p' || true
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

# kube_units KUBELET (kubelet, k3s or rke2): KUBE_UNITS becomes the systemd units that run the
# node's kubelet. k3s and rke2 run it inside their own service (server or agent, whichever is
# installed), so ordering against kubelet.service there orders nothing.
# shellcheck disable=SC2034  # KUBE_UNITS is read by the steps
kube_units() {
  case $1 in
    k3s) KUBE_UNITS=(k3s.service k3s-agent.service) ;;
    rke2) KUBE_UNITS=(rke2-server.service rke2-agent.service) ;;
    *) KUBE_UNITS=(kubelet.service) ;;
  esac
}
