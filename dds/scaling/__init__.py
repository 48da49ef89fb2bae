"""What the gRPC provider and the controller share: in-flight instances and their lifecycle, the nodes a scale
request names, and the decider interface between the two (dds/scaling/requests.py)."""
