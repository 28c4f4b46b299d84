"""Cross-key checks of the whole stack, one module per concern; `StackConfig` runs them in a fixed order.

`edge` what clients reach (served names, routes, certificates, auth, the edge's own keys), `secret_keys` one
credential per secret config key, `disks` the nodes' arrays (and the deployed partitions), `model_volume` where the
weights live, `gpus` which nodes a model's pods fit on (and the MIG instances they fit in), `lora` adapters against
their base, `scaling` replicas, scale to zero and the HTTP add-on's Services, `runtime` what the pods run with,
`reproducible` pinned revisions.
"""
