"""gpu-serving policy pack; `python -m policy.check_yaml` checks plain manifests."""
