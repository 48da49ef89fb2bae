"""Label matching as kube-scheduler does it: node selector terms (node affinity) and label selectors (pod affinity).

Plain functions over plain data; an unknown operator never matches (and `unsupported_operators` reports it, so the
pod is marked UNSUPPORTED instead of silently judged).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from dds.model.snapshot import LabelSelector, NodeSelectorTerm, PodInfo, SelectorRequirement

NODE_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
FIELD_NAME = "metadata.name"


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def requirement_matches(requirement: SelectorRequirement, labels: Mapping[str, str]) -> bool:
    """One requirement against a label map. NotIn and DoesNotExist match when the label is absent (as upstream)."""
    op, key = requirement.operator, requirement.key
    present = key in labels
    if op == "In":
        return present and labels[key] in requirement.values
    if op == "NotIn":
        return not present or labels[key] not in requirement.values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(requirement.values) != 1:
            return False
        have, bound = _as_int(labels[key]), _as_int(requirement.values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def term_matches(term: NodeSelectorTerm, node_name: str, labels: Mapping[str, str]) -> bool:
    """All requirements of a term (ANDed). An empty term matches no node (upstream: "null or empty term matches no
    objects")."""
    if not term.match_expressions and not term.match_fields:
        return False
    if not all(requirement_matches(r, labels) for r in term.match_expressions):
        return False
    fields = {FIELD_NAME: node_name}
    return all(r.key == FIELD_NAME and requirement_matches(r, fields) for r in term.match_fields)


def node_affinity_matches(terms: Iterable[NodeSelectorTerm], node_name: str, labels: Mapping[str, str]) -> bool:
    """Required node affinity: terms are ORed; no terms = no constraint."""
    terms = tuple(terms)
    return not terms or any(term_matches(t, node_name, labels) for t in terms)


def label_selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """A pod-affinity label selector: matchLabels and matchExpressions ANDed; an empty selector matches every pod."""
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    return all(requirement_matches(r, labels) for r in selector.match_expressions)


def unsupported_operators(pod: PodInfo) -> tuple[str, ...]:
    """Operators or fields the simulation cannot judge, as reasons naming the pod field."""
    reasons: list[str] = []
    for term in pod.required_node_affinity:
        for r in term.match_expressions:
            if r.operator not in NODE_OPERATORS:
                reasons.append(f"nodeAffinity matchExpressions operator {r.operator!r} on {r.key!r}")
        for r in term.match_fields:
            if r.key != FIELD_NAME:
                reasons.append(f"nodeAffinity matchFields key {r.key!r} (only {FIELD_NAME} is defined)")
            elif r.operator not in ("In", "NotIn"):
                reasons.append(f"nodeAffinity matchFields operator {r.operator!r}")
    for kind, terms in (("podAffinity", pod.required_pod_affinity),
                        ("podAntiAffinity", pod.required_pod_anti_affinity)):
        for term in terms:
            for r in term.label_selector.match_expressions:
                if r.operator not in LABEL_OPERATORS:
                    reasons.append(f"{kind} labelSelector operator {r.operator!r} on {r.key!r}")
    return tuple(reasons)
