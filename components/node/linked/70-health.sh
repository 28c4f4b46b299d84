#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/70-health.sh, rendered by components/node.py
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







# ---- 70-health.sh
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
