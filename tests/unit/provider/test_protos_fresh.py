"""The checked-in generated code matches protos/ (regenerated into a temp dir with hack/gen-protos.sh)."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GENERATED = REPO / "dds" / "provider" / "gen"


def _files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*.py"))}


def test_generated_code_is_fresh(tmp_path):
    out = tmp_path / "gen"
    subprocess.run(["bash", str(REPO / "hack" / "gen-protos.sh"), str(out)], check=True, cwd=REPO,
                   env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}, capture_output=True, timeout=120)
    fresh, checked_in = _files(out), _files(GENERATED)
    assert sorted(fresh) == sorted(checked_in), "generated files differ from dds/provider/gen: run make protos"
    stale = [name for name in fresh if not filecmp.cmp(fresh[name], checked_in[name], shallow=False)]
    assert not stale, f"dds/provider/gen is stale ({', '.join(stale)}): run make protos"


def test_wire_names_match_the_cluster_autoscaler_contract():
    from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["CloudProvider"]
    assert service.full_name == "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
    assert len(service.methods) == 15
    numbers = {f.name: f.number for f in pb.NodeGroupAutoscalingOptions.DESCRIPTOR.fields}
    assert numbers == {"scaleDownUtilizationThreshold": 1, "scaleDownGpuUtilizationThreshold": 2,
                       "scaleDownUnneededTime": 3, "scaleDownUnreadyTime": 4, "MaxNodeProvisionTime": 5,
                       "zeroOrMaxNodeScaling": 6, "ignoreDaemonSetsUtilization": 7, "scaleDownUnneededDuration": 8,
                       "scaleDownUnreadyDuration": 9, "MaxNodeProvisionDuration": 10}
    template = {f.name: (f.number, f.message_type.full_name if f.message_type else f.type)
                for f in pb.NodeGroupTemplateNodeInfoResponse.DESCRIPTOR.fields}
    assert template == {"nodeInfo": (1, "k8s.io.api.core.v1.Node"), "nodeBytes": (2, 12)}  # 12 = TYPE_BYTES
