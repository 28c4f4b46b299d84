#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/50-mount.sh, rendered by components/node.py
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








# settle: let udev finish pending events first. Closing a disk or partition after a write makes
# udev re-read that disk's partition table, and during the re-read its partitions briefly vanish.
settle() {
  udevadm settle --timeout=30 || true
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
# ---- 50-mount.sh
# Step 50, mount: the array's XFS in /etc/fstab by filesystem UUID, then mounted.
# The fstab line is added once and replaced (never duplicated) when its options or mountpoint
# change; a line of another device for our mountpoint, however its path is spelt, is refused, and
# the step ends by checking that what is mounted there is our array. nofail keeps a missing array
# from blocking boot; x-systemd.before= orders the mount before the unit that runs the kubelet
# (kubelet.service, or the k3s / rke2 service, which runs the kubelet inside). Before the first
# mount the empty mountpoint directory is made immutable (chattr +i), so if the array is ever
# missing at boot nothing can write model files onto the root filesystem beneath it.
# The step runs again on a serving node whenever its text changes (any lib.sh change): it never
# unmounts anything but the old configured mountpoint, and refuses to move the mount while the
# filesystem has other mounts (kubelet's bind mounts of the local PV into pods). Every refusal
# comes before the first write. fstab and the unit files are replaced atomically and synced.
: "${GS_RAID_NAME:?}" "${GS_MOUNTPOINT:?}" "${GS_DEVICE_TIMEOUT:?}" "${GS_KUBELET:?}"

need_root
need_tools blkid findmnt mount mdadm flock
node_lock 50-mount
md=/dev/md/$GS_RAID_NAME
[[ -b $md ]] || die "$md does not exist; the raid step (30) must run first"
real=$(readlink -f -- "$md")
uuid=""
while IFS= read -r line; do
  [[ $line != UUID=* ]] || uuid=${line#UUID=}
done < <(blkid -p -o export -- "$md" || true)
[[ -n $uuid ]] || die "$md has no filesystem UUID; the filesystem step (40) must run first"
kube_units "$GS_KUBELET"

# fstab escapes blanks and backslashes in paths as octal.
mp=${GS_MOUNTPOINT//\\/\\134}
mp=${mp// /\\040}
mp=${mp//$'\t'/\\011}
order=""
for u in "${KUBE_UNITS[@]}"; do
  order+=",x-systemd.before=$u"
done
want="UUID=$uuid $mp xfs noatime,nofail,x-systemd.device-timeout=${GS_DEVICE_TIMEOUT}s$order 0 0"

# Each line is compared by the directory its target names (fstab_paths): `mount PATH` and the boot
# take a line written `/mnt/models/` or `/mnt//models` for /mnt/models, so such a line of another
# filesystem would be mounted in place of ours.
fstab_paths
changed=0 found=0 lines=() old_targets=() replaced=()
for i in "${!FSTAB_LINES[@]}"; do
  line=${FSTAB_LINES[i]} source=${FSTAB_SOURCES[i]} path=${FSTAB_PATHS[i]}
  # Ours by any name mount(8) resolves to our device: UUID= (quoted or not), a device path other
  # than ours (/dev/md/1, /dev/disk/by-id/md-uuid-…: an adopted role's line may name it so), a
  # LABEL= its filesystem carries. `-ef` compares the device nodes the paths lead to.
  tag=${source%%=*} value=${source#*=}
  value=${value#\"}
  value=${value%\"}
  ours=0
  case $source in
    UUID=*) [[ $value != "$uuid" ]] || ours=1 ;;
    LABEL=* | PARTUUID=* | PARTLABEL=*) [[ ! /dev/disk/by-${tag,,}/$value -ef $real ]] || ours=1 ;;
    /dev/*) [[ ! $source -ef $real ]] || ours=1 ;;
  esac
  if ((ours)); then
    # Ours under any spelling of any mountpoint: replaced by our line (the old mountpoint, if it was
    # another directory, is moved below).
    if [[ $line == "$want" ]] && ((found == 0)); then
      found=1
      lines+=("$line")
    else
      [[ -z $path || $path == "$MP_PATH" ]] || old_targets+=("$path")
      replaced+=("$line")
    fi
    continue
  fi
  # Another filesystem's line is the operator's: never dropped, refused. Its options may hold a
  # password (cifs), so the message names its line number, source and target only.
  if [[ -n $path && $path == "$MP_PATH" ]]; then
    die "/etc/fstab line $((i + 1)) mounts $source at ${FSTAB_TARGETS[i]}, which is storage.mountpoint $GS_MOUNTPOINT: 'mount $GS_MOUNTPOINT' and the next boot would mount that instead of our array. Remove or comment out that line (or choose another storage.mountpoint), then run pulumi up again"
  fi
  lines+=("$line")
done
if ((found == 0)); then
  lines+=("$want")
fi

# Where the filesystem is mounted now: by device number, which kubelet's bind mounts share.
dev_num=$(<"/sys/class/block/${real##*/}/dev")
mounts=()
while read -r majmin target; do
  [[ $majmin == "$dev_num" ]] || continue
  printf -v target '%b' "$target" # findmnt -r writes blanks as \x20
  mounts+=("$target")
done < <(findmnt -rn -o MAJ:MIN,TARGET || true)
move=() others=()
for target in "${mounts[@]}"; do
  [[ $target != "$MP_PATH" ]] || continue
  old=0
  for o in "${old_targets[@]}"; do
    [[ $o != "$target" ]] || old=1
  done
  if ((old)); then
    move+=("$target")
  else
    others+=("$target")
  fi
done
if ((${#move[@]} && ${#others[@]})); then
  die "storage.mountpoint changed from ${move[0]} to $GS_MOUNTPOINT, but the filesystem is also mounted at ${#others[@]} other place(s), e.g. ${others[0]} (kubelet's bind mounts of the volume into pods); moving it would leave those pods on an empty directory. Drain the node first (kubectl drain), then run pulumi up again. Nothing was changed"
fi
# Under a mount of ours the new folder would be made inside the volume, and after the unmount the
# old mountpoint is an empty immutable folder in which nothing can be made.
for target in "${mounts[@]}" "${old_targets[@]}"; do
  [[ $MP_PATH != "${target%/}"/* ]] || die "storage.mountpoint $GS_MOUNTPOINT is inside $target, where the model filesystem is (or was) mounted; choose a path outside it. Nothing was changed"
done
# at_mountpoint: AT_NUM, AT_ROOT and AT_SOURCE become the device number, the folder of its
# filesystem and the source of what is mounted at MP_PATH now (the last mount there, the one on top);
# all "" when nothing is. Ours is our device from its root (a bind mount of a folder of it is not).
at_mountpoint() {
  local out
  AT_NUM="" AT_ROOT="" AT_SOURCE=""
  out=$(findmnt -rn -o MAJ:MIN,FSROOT,SOURCE --mountpoint "$MP_PATH" || true)
  [[ -n $out ]] || return 0
  read -r AT_NUM AT_ROOT AT_SOURCE <<<"${out##*$'\n'}"
  printf -v AT_ROOT '%b' "$AT_ROOT" # findmnt -r writes blanks as \x20
  printf -v AT_SOURCE '%b' "$AT_SOURCE"
}
at_mountpoint
current=$AT_NUM
if [[ -n $current && ($current != "$dev_num" || $AT_ROOT != /) ]]; then
  die "${AT_SOURCE:-another filesystem} is mounted at $GS_MOUNTPOINT, not our array $md; unmount it or choose another storage.mountpoint"
fi
# Made before the old mountpoint is unmounted, so that a path that cannot be made leaves it mounted.
if [[ -z $current && ! -d $GS_MOUNTPOINT ]]; then
  say "creating $GS_MOUNTPOINT"
  err=$(mkdir -p -- "$GS_MOUNTPOINT" 2>&1) || die "cannot create $GS_MOUNTPOINT (${err##*: }); if a folder above it is an old mountpoint (kept empty and immutable: 'lsattr -d PATH'), choose a path outside it, then run pulumi up again"
fi

# The old mountpoint goes first: if it is busy, nothing has been written yet.
for target in "${move[@]}"; do
  say "unmounting the old mountpoint $target"
  umount -- "$target" || die "cannot unmount $target (in use?); stop what uses it (kubectl drain), then run pulumi up again"
  changed=1
done

if ((${#replaced[@]})) || ((found == 0)); then
  for line in "${replaced[@]}"; do
    say "replacing the fstab line: $line"
  done
  say "writing /etc/fstab: $want"
  printf -v text '%s\n' "${lines[@]}"
  write_atomic /etc/fstab 644 "$text"
  [[ ! -d /run/systemd/system ]] || systemctl daemon-reload
  changed=1
else
  say "/etc/fstab line present, unchanged"
fi

# Boot with a member missing: initramfs-tools assembles the array but starts it only when complete,
# and Debian's mdadm-last-resort timer never fires for an array the initramfs assembled, so it stays
# inactive and the nofail mount gives up. A small unit (before kubelet) starts it degraded after a
# short wait for the missing disk and mounts it; it does nothing when the array is running.
# install_file PATH MODE TEXT: write only when the content differs.
install_file() {
  local current=""
  [[ ! -e $1 ]] || current=$(<"$1")
  [[ $current != "${3%$'\n'}" ]] && {
    say "writing $1"
    write_atomic "$1" "$2" "$3"
    changed=1
    units=1
  }
  return 0
}
units=0
helper=/usr/local/sbin/gpu-serving-start-array
unit=gpu-serving-array-$GS_RAID_NAME.service
# The helper waits at most ~90 s for the disk (15 rounds of udev settle and a second), then mounts.
BOOT_UNIT_TIMEOUT=180
md_uuid=$(array_uuid "$md")
[[ -n $md_uuid ]] || die "mdadm shows no array UUID for $md; check 'mdadm --detail $md' and run pulumi up again"
unit_arg() {
  local a=${1//\\/\\\\}
  a=${a//\"/\\\"}
  a=${a//%/%%}
  printf -v "$2" '"%s"' "${a//\$/\$\$}"
}
q_name="" q_mp=""
unit_arg "$GS_RAID_NAME" q_name
unit_arg "$GS_MOUNTPOINT" q_mp
if [[ -d /run/systemd/system ]]; then
  mkdir -p /usr/local/sbin
  # shellcheck disable=SC2016  # the helper's own variables, expanded when it runs
  install_file "$helper" 755 '#!/bin/bash
# Installed by gpu-serving (node step 50-mount). At boot: when the model RAID NAME was left
# inactive because a member is missing, wait briefly for the disk, start the array degraded
# and mount MOUNTPOINT. Does nothing when the array already runs. The array is known by its
# superblock name or by its UUID (an adopted array keeps the name its builder gave it).
set -u
name=$1 mountpoint=$2 uuid=${3:-none}
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
  [ -e "/dev/md/$name" ] && break
  udevadm settle --timeout=5
  sleep 1
done
if [ ! -e "/dev/md/$name" ]; then
  for state in /sys/block/md*/md/array_state; do
    [ -r "$state" ] && [ "$(cat "$state")" = inactive ] || continue
    md=${state%/md/array_state}
    md=/dev/${md##*/}
    mdadm --detail --export "$md" 2>/dev/null | grep -q -e "^MD_NAME=\(.*:\)\?$name\$" -e "^MD_UUID=$uuid\$" || continue
    echo "starting $md ($name) degraded: a member is missing"
    mdadm --run "$md"
  done
  udevadm settle --timeout=10
fi
if [ -e "/dev/md/$name" ] && ! findmnt -rn --mountpoint "$mountpoint" >/dev/null; then
  # systemd may mount it from fstab at the same moment: either way it ends up mounted.
  mount "$mountpoint" 2>/dev/null || findmnt -rn --mountpoint "$mountpoint" >/dev/null || mount "$mountpoint"
fi
exit 0
'
  install_file "/etc/systemd/system/$unit" 644 "[Unit]
Description=gpu-serving: start RAID $GS_RAID_NAME (degraded if a disk is missing) and mount it
After=local-fs.target systemd-udev-settle.service
Before=${KUBE_UNITS[*]}

[Service]
Type=oneshot
RemainAfterExit=yes
# Bounded: a hung mdadm or mount must not hold the kubelet back (Before= orders, it does not require).
TimeoutStartSec=$BOOT_UNIT_TIMEOUT
ExecStart=$helper $q_name $q_mp $md_uuid

[Install]
WantedBy=multi-user.target
"
  if ((units)) || ! systemctl -q is-enabled "$unit" 2>/dev/null; then
    systemctl daemon-reload
    systemctl -q enable "$unit"
    # enable's symlink is not synced by systemctl: a power cut now would lose it (and the unit's
    # degraded start at the next boot). sync -f is syncfs(2) of the filesystem that holds /etc.
    sync -f "/etc/systemd/system/$unit"
    changed=1
  fi
fi

if [[ -z $current ]]; then
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
else
  say "$GS_MOUNTPOINT is mounted, unchanged"
fi
# The last word before "mounted": mount(8) took the path to an fstab line, and only what is mounted
# there now says whose it was. Whatever a line says, another filesystem is never reported as ours.
at_mountpoint
if [[ $AT_NUM != "$dev_num" || $AT_ROOT != / ]]; then
  what=${AT_SOURCE:-nothing}
  if [[ -z $current && -n $AT_NUM ]]; then
    umount -- "$MP_PATH" || true
    what+=" (unmounted again)"
  fi
  die "after 'mount $GS_MOUNTPOINT', $what is mounted there, not our array $md (device $dev_num). See which line mount(8) takes for it: 'findmnt --fstab --target $GS_MOUNTPOINT'; remove that line or choose another storage.mountpoint, then run pulumi up again"
fi

result=unchanged
((changed == 0)) || result=changed
j=""
json_str j "$GS_MOUNTPOINT"
printf '{"step":"mount","result":"%s","mountpoint":%s,"uuid":"%s","device":"%s"}\n' "$result" "$j" "$uuid" "$md"
