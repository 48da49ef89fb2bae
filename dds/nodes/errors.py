"""Typed failures of a node backend: what went wrong, on which group and object, and whether a retry can help.

Callers (the deciders, the controller's executor) retry `retryable` errors with the same idempotency key; the others
need a person or a changed configuration, and their message says what to look at.
"""

from __future__ import annotations


class NodeBackendError(Exception):
    """A node backend call failed; nothing was half-applied (see each backend for how it guarantees that)."""

    retryable = False


class NodeBackendUnavailable(NodeBackendError):
    """The apiserver could not be reached, timed out, answered 5xx/429, or kept answering Conflict: try again."""

    retryable = True


class MachineSetNotFound(NodeBackendError):
    """The group's MachineSet does not exist (deleted since the group was read), is being deleted, or Cluster API is
    not installed."""


class NodeNotInGroup(NodeBackendError):
    """remove_node named a node that is not a machine of the group: refused, nothing changed."""


class ScaleRefused(NodeBackendError):
    """The request would take the group beyond its maximum size: refused, nothing changed."""
