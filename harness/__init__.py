"""The test harness, outside the installed package: the local control plane (etcd, kube-apiserver, kube-scheduler,
kwok, the real cluster-autoscaler as processes), the whole stack for `make demo`, the e2e and reliability tests, the
crash campaign and its invariants, and stand-ins for what cannot run here (a CDI operator, a Redfish service).

Importable from a checkout (the repository root on sys.path: `python -m harness.demo`, pytest); never shipped in the
wheel or the image."""
