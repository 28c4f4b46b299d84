#!/bin/bash
# FAKE ctr (testbed/vm/fakes/ctr.sh).
# `ctr plugins ls`, as containerd's ctr prints it (TYPE ID PLATFORMS STATUS), with the CRI plugin's
# status as FAKE containerd loaded it; "failed to dial" while the daemon is not running.
set -uo pipefail
[[ "$*" == "plugins ls" ]] || { echo "FAKE ctr: unsupported: $*" >&2; exit 2; }
read -r pid status </run/fake-containerd/cri 2>/dev/null
if [[ -z ${pid:-} || ! -d /proc/$pid ]]; then
  echo 'ctr: failed to dial "/run/containerd/containerd.sock": connection refused' >&2
  exit 1
fi
printf '%-32s%-12s%-16s%s\n' TYPE ID PLATFORMS STATUS \
  io.containerd.content.v1 content - ok \
  io.containerd.snapshotter.v1 overlayfs linux/amd64 ok \
  io.containerd.grpc.v1 cri linux/amd64 "$status"
