"""Fixtures every test folder can use: `control_plane` and `namespace` (the real control plane, see
harness/pytest_plugin.py). Unit tests never request them, and then nothing is built or started."""

import os

# The test process talks gRPC (to DDS) and forks processes (etcd, the apiserver, DDS, cluster-autoscaler). grpcio's fork
# handlers run in the child between fork and exec and can abort it ("epoll_wait error: Bad file descriptor", SIGABRT);
# the children exec at once and need none of them. Set before grpc is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# harness.rbac_plugin: DDS and cluster-autoscaler under the shipped RBAC; a 403 to either fails the test.
pytest_plugins = ["harness.pytest_plugin", "harness.rbac_plugin"]
