#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/40-filesystem.sh, rendered by components/node.py
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








# settle: let udev finish pending events first. Closing a disk or partition after a write makes
# udev re-read that disk's partition table, and during the re-read its partitions briefly vanish.
settle() {
  udevadm settle --timeout=30 || true
}














# array_uuid DEV: prints the UUID of the running array DEV, nothing when mdadm shows none.
array_uuid() {
  mdadm --detail --export "$1" 2>/dev/null | sed -n 's/^MD_UUID=//p' || true
}




# ---- 40-filesystem.sh
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
