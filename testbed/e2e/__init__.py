"""make e2e: the program under the real Pulumi engine, end to end.

    python -m testbed.e2e                 # all checks, report in e2e-out/report.json
    python -m testbed.e2e --keep          # keep the temporary project, state and VM folder
    python -m testbed.e2e --real-only     # only the real-node and two-node checks (real_node.py, real_cache.py)

Needs `make engine` (the CLI, the Python language host and the kubernetes and command providers,
built from pinned Go modules) and the VM image of testbed/vm. Everything happens in a temporary
folder: a copy of the project's tracked files, a local file backend, secrets encrypted with a
random passphrase, and a throwaway VM (the lab node) reached over SSH on 127.0.0.1. The Kubernetes
provider writes YAML (`cluster.renderYamlTo`), so no cluster is needed.

One check per step, in order; a check that needs an earlier one's result fails when it failed.
Prints one line per check and exits 1 when any failed.
"""
