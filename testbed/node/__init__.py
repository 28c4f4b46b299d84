"""The lab VM as a real Kubernetes node (docs/real-node-plan.md): what its containerd imports.

images.py builds the pods' images into one OCI archive (oci.py writes it); pause/ is the sandbox
image's program.
"""
