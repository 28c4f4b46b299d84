"""Typed stack configuration: everything a `Pulumi.<stack>.yaml` may choose.

The models are the one source of truth for keys, types and defaults; docs/configuration.md's config
reference is written from them. Everything is validated before any resource is declared,
and every error names the key path the user has to change. One module per top-level key
(`cluster`, `nodes`, `modelStorage`, `models`; a node's GPU sharing in `sharing`), the time budgets a
model's size implies in `budgets`, the whole stack in `stack` with its cross-key checks by concern in
`checks`, and the error reporting in `load`.
"""

from stacks.config.base import PROJECT, ConfigError
from stacks.config.checks.disks import refuse_shrinking
from stacks.config.cluster import ClusterConfig, DevicePlugin, GpuTaint, Kubeconfig, PrometheusAdapter
from stacks.config.load import TOP_LEVEL_KEYS, parse
from stacks.config.models import BUNDLE_ENV, BUNDLE_FLAGS, MODEL_NAME_MAX, SECRET_LIKE, Ingress, Model, Replicas, flag_name
from stacks.config.nodes import Gpu, Node, NodeStorage, Ssh, partition_bytes, size_gb_for
from stacks.config.sharing import Mig, Sharing, TimeSlicing
from stacks.config.stack import ROLLOUT_SALT_SECRET, StackConfig
from stacks.config.storage import ClassStorage, LocalStorage, ModelStorageConfig, NfsStorage, NodeCacheStorage, usable_gib

__all__ = [
    "BUNDLE_ENV", "BUNDLE_FLAGS", "MODEL_NAME_MAX", "PROJECT", "ROLLOUT_SALT_SECRET", "SECRET_LIKE", "TOP_LEVEL_KEYS",
    "ClassStorage", "ClusterConfig", "ConfigError", "DevicePlugin", "Gpu", "GpuTaint", "Ingress", "Kubeconfig",
    "LocalStorage", "Mig", "Model", "ModelStorageConfig", "NfsStorage", "Node", "NodeCacheStorage", "NodeStorage", "PrometheusAdapter",
    "Replicas", "Sharing", "Ssh", "StackConfig", "TimeSlicing", "flag_name", "parse", "partition_bytes", "refuse_shrinking",
    "size_gb_for", "usable_gib",
]
