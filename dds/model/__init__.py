"""Pure, typed models shared by every layer (no I/O, no Kubernetes or gRPC imports)."""
