"""Integration tests run against the real control plane: the session-scoped `control_plane` fixture (etcd,
kube-apiserver, kube-scheduler and kwok as local processes, with the Cluster API and ComposabilityRequest CRDs) and the
per-test `namespace` come from harness/pytest_plugin.py, registered in tests/conftest.py so tests/e2e shares them."""
