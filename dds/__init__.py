"""DDS: Dynamic Device Scaling — a cluster-autoscaler externalgrpc cloud provider that scales GPUs vertically."""

__version__ = "0.1.0"
