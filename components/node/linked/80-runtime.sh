#!/usr/bin/env bash
set -euo pipefail
# gpu-serving: components/node_scripts/80-runtime.sh, rendered by components/node.py
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

# ---- 80-runtime.sh
# Step 80, runtime: make the node's container runtime able to start GPU containers.
# The step runs again on a serving node whenever its text changes (any lib.sh change), and a
# runtime restart stops that node's GPU pods: restarts happen only when needed, one node at a time
# (components/node.py chains the nodes' runtime steps), and never with a configuration that fails.
# containerd: `nvidia-ctk runtime configure --runtime=containerd` (into the drop-in
#   /etc/containerd/conf.d/99-nvidia.toml when the toolkit supports --drop-in-config, >= 1.18;
#   into config.toml before that). Then, before any restart:
#   - every `imports` entry config.toml had is put back if the toolkit dropped it (1.18.0 replaces
#     the line);
#   - `containerd config dump` must load the result; if it does not, the files are restored from
#     the copies taken before the toolkit ran (kept in /var/lib/gpu-serving/containerd-backup)
#     and the step fails without restarting;
#   - containerd before 2.1 replaces a whole plugin section on import, so the drop-in's copy of
#     the CRI section overrides config.toml: settings of config.toml missing from the copy are
#     named (keys only) in a warning.
#   containerd is restarted only when its configuration really changed (sha256 of every file
#   before and after), or when an earlier run stopped between writing and restarting; the toolkit
#   may rewrite a file with the same content, which does not count.
# k3s / rke2: they write their own containerd config at every start and add the `nvidia`
#   runtime themselves when nvidia-container-runtime is installed; editing that file is
#   pointless (it is regenerated). Only the agent service is restarted, and only when its
#   generated config lacks the nvidia runtime; the step then checks that the runtime appeared.
#   A server (k3s.service, rke2-server.service) is never restarted: that is the control plane.
#   --set-as-default does not apply there: GPU pods use the RuntimeClass `nvidia`.
# Never prints configuration contents (they may hold registry credentials).
: "${GS_RUNTIME:?}" "${GS_SET_AS_DEFAULT:?}"

need_root
need_tools flock
node_lock 80-runtime

# sums FILE...: SUMS becomes the sha256 (or "absent") of each file, one line each.
sums() {
  local f
  SUMS=""
  for f in "$@"; do
    if [[ -e $f ]]; then
      SUMS+="$(sha256sum <"$f") $f"$'\n'
    else
      SUMS+="absent $f"$'\n'
    fi
  done
}

# toml_imports FILE: IMPORTS becomes the entries of FILE's top-level `imports = [...]` (on one
# line or several); IMPORTS_AT its first line number (0: none).
toml_imports() {
  local line block="" open=0 n=0 rest re='^[^"]*"([^"]*)"(.*)$'
  IMPORTS=() IMPORTS_AT=0 IMPORTS_LINES=0
  [[ -e $1 ]] || return 0
  while IFS= read -r line || [[ -n $line ]]; do
    n=$((n + 1))
    if ((open == 0)); then
      [[ ! $line =~ ^[[:space:]]*\[ ]] || break # the first table: no top-level keys after it
      [[ $line =~ ^[[:space:]]*imports[[:space:]]*= ]] || continue
      open=1 IMPORTS_AT=$n
    fi
    block+=" $line"
    IMPORTS_LINES=$((IMPORTS_LINES + 1))
    [[ $line != *"]"* ]] || break
  done <"$1"
  rest=$block
  while [[ $rest =~ $re ]]; do
    IMPORTS+=("${BASH_REMATCH[1]}")
    rest=${BASH_REMATCH[2]}
  done
}

declare -A SECTION_KEYS=()
# toml_sections FILE: SECTION_KEYS[<table header>] becomes that table's `key = value` lines,
# blanks trimmed, one per line.
toml_sections() {
  local line header=""
  SECTION_KEYS=()
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line#"${line%%[![:space:]]*}"}
    line=${line%"${line##*[![:space:]]}"}
    [[ -n $line && $line != \#* ]] || continue
    if [[ $line == \[* ]]; then
      header=$line
      continue
    fi
    [[ -n $header ]] || continue
    SECTION_KEYS[$header]+="$line"$'\n'
  done <"$1"
}

# restart_containerd: restarts containerd and checks its CRI plugin (cri_up); false, with
# CRI_STATUS saying why, when either is not up in time. systemd refuses a unit started more than
# StartLimitBurst times within StartLimitIntervalSec (5 in 10 s by default). A failed CRI check
# restarts containerd twice in a few seconds; if the second start, the one back to the restored
# files, were refused, the node would be left with no container runtime. reset-failed clears that
# count first. containerd's unit is Type=notify: a daemon that hangs before it is ready under a
# drop-in without a start timeout would otherwise hold the step forever (restart_unit).
restart_containerd() {
  systemctl reset-failed containerd 2>/dev/null || true
  if ! restart_unit containerd 120; then
    CRI_STATUS="containerd did not come back within ${UNIT_WAIT} s of its restart: $UNIT_STATE${UNIT_ERROR:+, $UNIT_ERROR}"
    return 1
  fi
  cri_up
}

case $GS_RUNTIME in
  containerd)
    need_tools nvidia-ctk containerd systemctl sha256sum
    config=/etc/containerd/config.toml dropin=/etc/containerd/conf.d/99-nvidia.toml
    args=(runtime configure --runtime=containerd --config="$config")
    [[ $GS_SET_AS_DEFAULT != true ]] || args+=(--set-as-default)
    # Captured first: `| grep -q` would close the pipe early, the toolkit would die of SIGPIPE and
    # pipefail would turn a match into a miss.
    help=$(nvidia-ctk runtime configure --help 2>&1) || true
    if [[ $help == *--drop-in-config* ]]; then
      args+=(--drop-in-config="$dropin")
    else
      dropin=""
    fi
    files=("$config")
    [[ -z $dropin ]] || files+=("$dropin")
    # A run cut short after the toolkit wrote and before containerd restarted leaves a config the
    # daemon has not read. The marker lives in /run: a reboot clears it, and a reboot also makes
    # containerd read its config. (Comparing file mtimes with the daemon's start time was tried:
    # /proc gives whole seconds and btime is rounded down, so it saw fresh restarts as stale.)
    pending=$LOCK_DIR/containerd-restart-pending
    stale=0
    [[ ! -e $pending ]] || stale=1
    # The toolkit rewrites config.toml even when nothing changes: keep each file's mtime aside
    # and put it back when the content is the same, so an unchanged run leaves no trace.
    ref=$(mktemp -d)
    trap 'rm -rf "$ref"' EXIT
    for i in "${!files[@]}"; do
      [[ ! -e ${files[i]} ]] || touch -r "${files[i]}" "$ref/$i"
    done
    # The files as they were, to restore when the toolkit's result does not load (root only:
    # config.toml may hold registry credentials).
    backup=/var/lib/gpu-serving/containerd-backup
    rm -rf "$backup"
    mkdir -p "${backup%/*}"
    mkdir -m 700 "$backup"
    for i in "${!files[@]}"; do
      [[ ! -e ${files[i]} ]] || cp -p -- "${files[i]}" "$backup/$i"
    done
    # Without a config the toolkit assumes version 2, which containerd 2.x rejects: start from the
    # version this containerd speaks. Made after the backup, so a restore removes it again.
    if [[ ! -e $config ]]; then
      read -r _ _ cversion _ < <(containerd --version)
      cversion=${cversion#v}
      version=2
      [[ ${cversion%%.*} -lt 2 ]] || version=3
      say "creating $config (version = $version, for containerd $cversion)"
      mkdir -p /etc/containerd
      printf 'version = %s\n' "$version" >"$config"
    fi
    restore() {
      local i
      for i in "${!files[@]}"; do
        if [[ -e $backup/$i ]]; then
          cp -p -- "$backup/$i" "${files[i]}"
        else
          rm -f -- "${files[i]}"
        fi
      done
      sync -- "${files[@]%/*}" 2>/dev/null || true
      ((stale)) || rm -f "$pending"
    }
    toml_imports "$config"
    kept=("${IMPORTS[@]}")
    sums "${files[@]}"
    before=$SUMS
    # Set just before the toolkit writes: an exit before this point leaves nothing to restart for.
    : >"$pending"
    nvidia-ctk "${args[@]}" >/dev/null 2>&1 || {
      restore
      die "nvidia-ctk ${args[*]} failed (files restored, containerd not restarted); run it by hand to see why"
    }

    # nvidia-ctk 1.18.0 replaces an existing imports line with its own: put the lost entries back.
    toml_imports "$config"
    lost=()
    for entry in "${kept[@]}"; do
      found=0
      for now in "${IMPORTS[@]}"; do
        [[ $now != "$entry" ]] || found=1
      done
      ((found)) || lost+=("$entry")
    done
    if ((${#lost[@]})); then
      say "the toolkit dropped imports entries of $config (${lost[*]}); putting them back"
      union=""
      for entry in "${kept[@]}" "${IMPORTS[@]}"; do
        [[ $union == *"\"$entry\""* ]] || union+="${union:+, }\"$entry\""
      done
      text="" n=0
      while IFS= read -r line || [[ -n $line ]]; do
        n=$((n + 1))
        if ((IMPORTS_AT && n >= IMPORTS_AT && n < IMPORTS_AT + IMPORTS_LINES)); then
          ((n != IMPORTS_AT)) || text+="imports = [$union]"$'\n'
          continue
        fi
        text+="$line"$'\n'
      done <"$config"
      ((IMPORTS_AT)) || text="imports = [$union]"$'\n'"$text"
      write_atomic "$config" "$(stat -c %a "$config")" "$text"
    fi

    # Does containerd load the result (TOML syntax, imports, known plugin sections)? Its output is
    # the whole configuration, credentials included: never shown.
    if ! containerd --config "$config" config dump >/dev/null 2>&1; then
      restore
      die "containerd cannot load the configuration nvidia-ctk wrote (${files[*]}); the files are restored and containerd was not restarted. The error is not shown (the configuration may hold credentials): run 'nvidia-ctk ${args[*]}' against a copy of /etc/containerd, then 'containerd --config <copy>/config.toml config dump >/dev/null'; a toolkit update may fix it"
    fi

    # containerd before 2.1 replaces a whole plugin section on import: settings of config.toml in
    # a plugin the drop-in also configures, and missing from the drop-in's copy, do nothing.
    read -r _ _ cversion _ < <(containerd --version)
    cversion=${cversion#v}
    cmajor=${cversion%%.*} cminor=${cversion#*.}
    cminor=${cminor%%.*}
    overridden=()
    if [[ -n $dropin && -e $dropin ]] && ((cmajor < 2 || (cmajor == 2 && cminor < 1))); then
      toml_sections "$dropin"
      declare -A drop=()
      for h in "${!SECTION_KEYS[@]}"; do
        drop[$h]=${SECTION_KEYS[$h]}
      done
      plugins=" "
      re='^\[plugins\."([^"]+)"'
      for h in "${!drop[@]}"; do
        [[ ! $h =~ $re ]] || plugins+="${BASH_REMATCH[1]} "
      done
      toml_sections "$config"
      for h in "${!SECTION_KEYS[@]}"; do
        [[ $h =~ $re && $plugins == *" ${BASH_REMATCH[1]} "* ]] || continue
        while IFS= read -r line; do
          [[ -n $line && $'\n'${drop[$h]:-} != *$'\n'"$line"$'\n'* ]] || continue
          overridden+=("${h} ${line%%[[:space:]=]*}")
        done <<<"${SECTION_KEYS[$h]}"
      done
      if ((${#overridden[@]})); then
        mapfile -t overridden < <(printf '%s\n' "${overridden[@]}" | sort)
        warn "containerd $cversion replaces a whole plugin section on import, so $dropin overrides these settings of $config, which have no effect: $(printf '%s; ' "${overridden[@]}")copy them into $dropin, or upgrade containerd to 2.1 or later"
      fi
      [[ $plugins == " " ]] || say "note: with containerd $cversion, later edits to plugins${plugins% } in $config are overridden by $dropin; edit both"
    fi

    sums "${files[@]}"
    if [[ $SUMS == "$before" ]]; then
      for i in "${!files[@]}"; do
        [[ ! -e $ref/$i ]] || touch -r "$ref/$i" "${files[i]}"
      done
    fi
    if [[ $SUMS == "$before" ]] && ((stale == 0)); then
      say "containerd configuration unchanged (${files[*]}); no restart"
      result=unchanged
    else
      say "containerd configuration changed (${files[*]}) or an earlier run stopped before restarting; restarting containerd"
      if ! restart_containerd; then
        # Back to the files it ran with, restarted again: this node gets its runtime back and the
        # failed step stops the node-by-node chain here.
        failed=$CRI_STATUS
        restore
        restored=ok
        restart_containerd || restored=failed
        rm -f "$pending"
        [[ $restored == ok ]] || die "containerd's CRI plugin is not up with the toolkit's configuration ($failed), nor with the restored one (${files[*]}: $CRI_STATUS); see 'journalctl -u containerd' for why, fix it by hand, then run pulumi up again"
        die "containerd restarted with the configuration nvidia-ctk wrote, but its CRI plugin did not come up ($failed): the kubelet would find no runtime. The files are restored (${files[*]}) and containerd restarted with them. See 'journalctl -u containerd' for why (the configuration is not shown: it may hold credentials); a toolkit update may fix it"
      fi
      result=changed
    fi
    rm -f "$pending"
    ;;
  k3s | rke2)
    generated=/var/lib/rancher/$GS_RUNTIME/agent/etc/containerd/config.toml
    has_nvidia() { [[ -r $generated ]] && grep -qE "runtimes\\.['\"]?nvidia['\"]?\\]" "$generated"; }
    [[ -x /usr/bin/nvidia-container-runtime || -x /usr/local/nvidia/toolkit/nvidia-container-runtime ]] ||
      die "nvidia-container-runtime is not installed; install nvidia-container-toolkit, then run pulumi up again ($GS_RUNTIME detects it when it starts)"
    if has_nvidia; then
      say "$GS_RUNTIME already has the nvidia runtime in $generated, unchanged"
      result=unchanged
    else
      agent=$GS_RUNTIME-agent
      # An agent still starting (activating: waiting for its server, or back-off after a crash) is
      # restarted as well: whether it would detect the runtime depends on when that start began.
      unit_state "$agent"
      if ((!UNIT_RUNNING)); then
        for server in "$GS_RUNTIME" "$GS_RUNTIME-server"; do
          unit_state "$server"
          ((!UNIT_RUNNING)) ||
            die "$GS_RUNTIME runs here as a server ($server.service, $UNIT_STATE) and $generated has no nvidia runtime. This step never restarts a server (that restarts the control plane): restart it yourself when that is safe ('systemctl restart $server'), then run pulumi up again"
        done
        die "no running $agent service found; start it, then run pulumi up again"
      fi
      say "restarting $agent ($UNIT_STATE) so that it detects nvidia-container-runtime"
      started=$(date +%s)
      fresh() { [[ -e $generated ]] && (($(stat -c %Y "$generated") >= started)); }
      if restart_unit "$agent" 120; then
        # Up: k3s and rke2 write their containerd config before they say they are ready; a unit that
        # is up sooner (Type=simple) gets a minute to write it.
        for _ in {1..30}; do
          ! fresh || break
          sleep 2
        done
      elif fresh && has_nvidia; then
        # Not an error: the agent writes its containerd config only once it has its configuration
        # from its server, and this one has the nvidia runtime, which is all this step is for; what
        # keeps the agent from being ready (its kubelet, a server gone since) is not the runtime's
        # and not this step's to fix. Failing would stop the other nodes' runtime steps, and the
        # next run would find the runtime in place and say "unchanged" anyway.
        warn "$agent wrote its containerd config with the nvidia runtime, but is not ready ${UNIT_WAIT} s after its restart ($UNIT_STATE); GPU pods start on this node once it is. See 'journalctl -u $agent' (can it reach its server?) and 'kubectl get node'"
      elif ! fresh; then
        # An error: nothing shows that the runtime is in place, and the runtime steps of the next
        # nodes (chained after this one) would restart their agents into the same unreachable server.
        die "$agent did not come back within ${UNIT_WAIT} s of its restart ($UNIT_STATE${UNIT_ERROR:+: $UNIT_ERROR}) and has not rewritten $generated, which $GS_RUNTIME does only once it has its configuration from its server: see 'journalctl -u $agent' ('Waiting to retrieve agent configuration' means it cannot reach its server: check the server address, token and network). Once 'systemctl status $agent' shows it active (systemd goes on with the start), run pulumi up again"
      fi
      has_nvidia || die "$agent restarted, but $generated has no nvidia runtime: $GS_RUNTIME did not detect nvidia-container-runtime. Check 'journalctl -u $agent' and that nvidia-container-runtime is on $GS_RUNTIME's PATH, then run pulumi up again"
      result=changed
    fi
    ;;
  *) die "unknown container runtime '$GS_RUNTIME'" ;;
esac
printf '{"step":"runtime","result":"%s","runtime":"%s","setAsDefault":%s}\n' "$result" "$GS_RUNTIME" "$GS_SET_AS_DEFAULT"
