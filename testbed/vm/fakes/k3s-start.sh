#!/bin/bash
# FAKE k3s/rke2 start (testbed/vm/fakes/k3s-start.sh): writes the generated containerd config as k3s does.
# Run as the service's ExecStartPre (fake_k3s_unit in __init__.py); the config names the nvidia runtime
# only when /etc/fake-k3s.detects exists, standing in for "it found nvidia-container-runtime". With
# /etc/fake-k3s.unreachable it writes nothing: k3s writes that config only once it has its configuration
# from its server ("Waiting to retrieve agent configuration; server is not ready" until then).
set -eu
[[ ! -e /etc/fake-k3s.unreachable ]] || exit 0
generated=/var/lib/rancher/$1/agent/etc/containerd/config.toml
mkdir -p "${generated%/*}"
{
  printf 'version = 2\n'
  if [[ -e /etc/fake-k3s.detects ]]; then
    printf '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]\n  runtime_type = "io.containerd.runc.v2"\n'
  fi
} >"$generated"
