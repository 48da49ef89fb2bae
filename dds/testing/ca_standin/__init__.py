"""A cluster-autoscaler stand-in: CA's documented client behaviour towards an externalgrpc provider, for tests and
`make demo` where the real binary cannot be built. See standin.py for the loop and what it leaves out."""

from .cluster import ClusterAccess, KubeCluster, cluster_access
from .config import CloudConfig, CloudConfigError, StandInOptions, load_cloud_config, parse_cloud_config, parse_go_duration
from .fit import Snapshot, binpack, fits, utilization, waste_score, why_not
from .provider import CloudProviderCrash, ExternalGrpcClient, Instance, NodeGroup, Placeholder, ProviderError, RpcCall
from .standin import AutoscalerStandIn, LoopAborted, LoopResult
from .views import NodeView, PodView, Taint, Toleration, node_from_manifest, pod_from_manifest

__all__ = ["AutoscalerStandIn", "CloudConfig", "CloudConfigError", "CloudProviderCrash", "ClusterAccess",
           "ExternalGrpcClient", "Instance", "KubeCluster", "LoopAborted", "LoopResult", "NodeGroup", "NodeView",
           "Placeholder", "PodView", "ProviderError", "RpcCall", "Snapshot", "StandInOptions", "Taint", "Toleration",
           "binpack", "cluster_access", "fits", "load_cloud_config", "node_from_manifest", "parse_cloud_config",
           "parse_go_duration", "pod_from_manifest", "utilization", "waste_score", "why_not"]
