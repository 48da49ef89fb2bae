"""Fixtures every test folder can use: `control_plane` and `namespace` (the real control plane, see
dds/testing/pytest_plugin.py). Unit tests never request them, and then nothing is built or started."""

pytest_plugins = ["dds.testing.pytest_plugin"]
