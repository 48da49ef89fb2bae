"""Node groups from their sources: MachineSet annotations or a YAML file parsed into NodeGroupSpec, and the labels
a group's nodes carry. Neither gRPC nor planning: the provider, the controller and the node backends all read them."""
