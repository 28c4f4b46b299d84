#!/usr/bin/env bash
set -euo pipefail
# Helpers shared by the node steps. components/node.py renders every step as:
#   shebang + `set -euo pipefail` + quoted GS_* parameters + this file + the step body.
# Functions only: loading this file changes nothing. Each process start is slow on a
# busy node (and ~30 ms in the test VM), so the helpers read sysfs and use bash
# builtins where they can instead of forking tools.

# shellcheck disable=SC2034  # read by the steps
MIB=1048576

say() { printf '%s\n' "$*"; }
warn() { printf 'WARNING: %s\n' "$*" >&2; }
die() {
  printf 'ERROR: %s\n' "$*" >&2
  exit 1
}

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

# resolve_disk PATH: sets DISK_DEV (/dev/sdX) and DISK_BASE (sdX); dies unless PATH is a whole disk.
# shellcheck disable=SC2034  # DISK_* are read by the steps
resolve_disk() {
  local path=$1
  [[ -b $path ]] || die "$path is not a block device on this node; check nodes[].storage.disks (stable names: ls -l /dev/disk/by-id)"
  DISK_DEV=$(readlink -f -- "$path")
  DISK_BASE=${DISK_DEV##*/}
  [[ ! -e /sys/class/block/$DISK_BASE/partition ]] || die "$path is a partition ($DISK_DEV); list whole disks in storage.disks, this program creates the partition itself"
  [[ -d /sys/block/$DISK_BASE ]] || die "$path ($DISK_DEV) is not a whole disk"
}

# scan_disk DEV NAME: reads DEV's partition table (`parted -m unit B print free`). Sets
#   SCAN_LABEL   gpt, msdos, unknown (no label), ...     SCAN_BYTES  disk size
#   SCAN_LAST_END  last byte of the last partition (-1: no partitions)
#   TAIL_START/TAIL_END  the largest free region after the last partition (-1: none)
#   PART_NUM PART_START PART_END PART_FLAGS  the partition named NAME (PART_NUM="" if none)
#   PART_COUNT   how many partitions are named NAME
#   AFTER_END    last byte of the free region right after partition NAME (= PART_END if none)
# shellcheck disable=SC2034  # SCAN_*, TAIL_*, PART_*, AFTER_END are read by the steps
scan_disk() {
  local dev=$1 name=$2 out line num start end size fs pname flags free
  local -a frees=()
  out=$(LC_ALL=C parted -m -s "$dev" unit B print free 2>/dev/null) || true
  SCAN_LABEL=unknown SCAN_BYTES=0 SCAN_LAST_END=-1 TAIL_START=-1 TAIL_END=-1
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
    esac
    IFS=: read -r num start end size fs pname flags <<<"$line"
    start=${start%B} end=${end%B}
    if [[ $fs == free ]]; then
      frees+=("$start:$end")
      continue
    fi
    ((end > SCAN_LAST_END)) && SCAN_LAST_END=$end
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
  local i
  for i in 1 2 3 4 5 6 7 8 9 10; do
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

# examine PART: what PART holds. SB_KIND: none | ours (an md member named GS_RAID_NAME) | foreign.
# SB_UUID: the array UUID of our member. SB_DESC: what was found, for messages.
# shellcheck disable=SC2034  # SB_* are read by the steps
examine() {
  local part=$1 sigs line md_name="" md_uuid="" md_level=""
  SB_KIND=none SB_UUID="" SB_DESC=""
  sigs=$(wipefs -n --noheadings --output TYPE -- "$part") || die "wipefs cannot read $part"
  sigs=${sigs//$'\n'/ }
  [[ -n $sigs ]] || return 0
  SB_DESC=$sigs
  if [[ $sigs != linux_raid_member ]]; then
    SB_KIND=foreign
    return 0
  fi
  while IFS= read -r line; do
    case $line in
      MD_NAME=*) md_name=${line#MD_NAME=} ;;
      MD_UUID=*) md_uuid=${line#MD_UUID=} ;;
      MD_LEVEL=*) md_level=${line#MD_LEVEL=} ;;
    esac
  done < <(mdadm --examine --export "$part" 2>/dev/null || true)
  SB_DESC="md member of array '$md_name' ($md_level, UUID $md_uuid)"
  if [[ ${md_name##*:} == "$GS_RAID_NAME" && $md_level == raid1 && -n $md_uuid ]]; then
    SB_KIND=ours SB_UUID=$md_uuid
  else
    SB_KIND=foreign
  fi
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

# kube_units RUNTIME: KUBE_UNITS becomes the systemd units that run the node's kubelet. k3s and
# rke2 run it inside their own service (server or agent, whichever is installed), so ordering
# against kubelet.service there orders nothing.
# shellcheck disable=SC2034  # KUBE_UNITS is read by the steps
kube_units() {
  case $1 in
    k3s) KUBE_UNITS=(k3s.service k3s-agent.service) ;;
    rke2) KUBE_UNITS=(rke2-server.service rke2-agent.service) ;;
    *) KUBE_UNITS=(kubelet.service) ;;
  esac
}
