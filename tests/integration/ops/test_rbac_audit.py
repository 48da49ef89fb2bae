"""DDS's RBAC against what the suite saw DDS's ServiceAccount do (the apiserver's audit logs, harness/audit.py).

Every control plane of the run logs its ServiceAccounts' requests; harness/rbac_plugin.py gathers, test by test, the
(verb, resource, subresource, apiGroup) DDS's ServiceAccount was allowed, and these tests (marked `rbac_audit`) run
after every other test of the session and read that record:

- nothing DDS used is missing from the roles manifests/dds ships — holds for any subset of the suite;
- per fabric: on a control plane where DDS had one fabric's grants only (an e2e stack, harness/rbac.py dds_for), it
  used nothing beyond them, so no other fabric's grant is needed there; and the grants only one fabric or feature
  ships (manifests/rbac/<feature>) were each used by DDS holding them (whole suite only, as below);
- every grant of those roles was used by some test, or is listed in docs/operations.md ("Grants the suite cannot
  exercise") with the feature that needs it. That half needs the whole suite: it is skipped, saying why, when a test
  file of tests/integration or tests/e2e was not collected, a test was deselected (other than the `slow` soak
  variants `make test` leaves out), or a test failed (its requests may have stopped short). So `pytest tests/unit`
  never collects these tests, and `pytest tests/integration/ops` runs the first and skips the second.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import rbac, versions
from harness.audit import Grant
from harness.rbac_plugin import AUDITED_SUITES, AuditRecord

pytestmark = [pytest.mark.integration, pytest.mark.rbac_audit]

ROOT = Path(__file__).resolve().parents[3]
OPERATIONS = ROOT / "docs" / "operations.md"
UNEXERCISED_HEADING = "### Grants the suite cannot exercise"
PER_MINOR_HEADING = "### Grants one Kubernetes minor uses"
# Verbs may carry a prefix (`arbitrary-node:update`: the per-driver authorization of a ResourceClaim's status).
_ROW = re.compile(r"^\|\s*`(?P<verb>[a-z:-]+) (?P<group>[^/`]+)/(?P<resource>[a-z0-9.]+)(?:/(?P<sub>[a-z]+))?`\s*\|")


def documented_unexercised(doc: Path = OPERATIONS) -> set[Grant]:
    """The grants docs/operations.md names as needed by a feature the suite cannot exercise (first column of the
    table under UNEXERCISED_HEADING, written as `verb group/resource[/subresource]`, group `core` for "")."""
    text = doc.read_text()
    assert UNEXERCISED_HEADING in text, f"{doc}: no section {UNEXERCISED_HEADING!r}"
    section = text.split(UNEXERCISED_HEADING, 1)[1].split("\n#", 1)[0]
    out = set()
    for line in section.splitlines():
        match = _ROW.match(line)
        if match:
            group = "" if match["group"] == "core" else match["group"]
            out.add(Grant(match["verb"], match["resource"], match["sub"] or "", group))
    return out


def documented_per_minor(doc: Path = OPERATIONS) -> dict[Grant, set[str]]:
    """The grants docs/operations.md names as used on some Kubernetes minors only (the API they read is served by
    those alone), with those minors: the table under PER_MINOR_HEADING, `verb group/resource` then the minors."""
    text = doc.read_text()
    assert PER_MINOR_HEADING in text, f"{doc}: no section {PER_MINOR_HEADING!r}"
    section = text.split(PER_MINOR_HEADING, 1)[1].split("\n#", 1)[0]
    out: dict[Grant, set[str]] = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match:
            group = "" if match["group"] == "core" else match["group"]
            minors = set(re.findall(r"\d+\.\d+", line.split("|")[2]))
            out[Grant(match["verb"], match["resource"], match["sub"] or "", group)] = minors
    return out


def incomplete_run(record: AuditRecord) -> list[str]:
    """Why this run cannot show that a grant is unused (empty: it can)."""
    on_disk = {p.relative_to(ROOT).as_posix() for suite in AUDITED_SUITES for p in (ROOT / suite).rglob("test_*.py")}
    reasons = []
    not_collected = sorted(on_disk - record.collected_files)
    if not_collected:
        reasons.append(f"{len(not_collected)} test files not collected (e.g. {', '.join(not_collected[:3])})")
    if record.deselected:
        reasons.append(f"{len(record.deselected)} tests deselected (e.g. {record.deselected[0]})")
    if record.failed:
        reasons.append(f"{len(record.failed)} tests failed (e.g. {record.failed[0]})")
    return reasons


def test_dds_used_nothing_its_shipped_roles_do_not_grant(rbac_audit: AuditRecord) -> None:
    granted = rbac.granted(rbac.DDS)
    missing = {grant: test for grant, test in rbac_audit.dds_used.items()
               if grant not in granted and grant not in rbac.EVERY_USER}
    assert not missing, "DDS's ServiceAccount was allowed requests its roles in manifests/dds do not grant:\n" + \
        "\n".join(f"  {grant.describe()} (first by {test})" for grant, test in sorted(missing.items(), key=repr))


def test_every_grant_of_dds_is_used_by_a_test_or_documented(rbac_audit: AuditRecord) -> None:
    granted = rbac.granted(rbac.DDS)
    documented = documented_unexercised()
    per_minor = documented_per_minor()
    stale = (documented | set(per_minor)) - granted
    assert not stale, (f"{OPERATIONS.name} lists grants the roles do not have: "
                       f"{sorted(g.describe() for g in stale)}")
    reasons = incomplete_run(rbac_audit)
    if reasons:
        pytest.skip("not the whole suite, so an unused grant cannot be told from an untested one: " + "; ".join(reasons))
    used = set(rbac_audit.dds_used) - rbac.EVERY_USER
    minor = versions.active_profile().name
    other_minors_only = {grant for grant, minors in per_minor.items() if minor not in minors}
    used_off_minor = other_minors_only & used
    assert not used_off_minor, (f"{OPERATIONS.name} says these are used on other Kubernetes minors only, but a test "
                                f"on {minor} used them: {sorted(g.describe() for g in used_off_minor)}")
    unused = granted - used - documented - other_minors_only
    assert not unused, ("grants of manifests/dds no test used and docs/operations.md does not name as needed by a "
                        f"feature the suite cannot exercise: {sorted(g.describe() for g in unused)}")
    exercised_after_all = documented & used
    assert not exercised_after_all, (f"{OPERATIONS.name} says the suite cannot exercise these, but a test did: "
                                     f"{sorted(g.describe() for g in exercised_after_all)} (first by "
                                     f"{[rbac_audit.dds_used[g] for g in exercised_after_all]})")


def with_features(features: tuple[str, ...]) -> rbac.Identity:
    return rbac.Identity(rbac.DDS.name, rbac.DDS.namespace, rbac.DDS.manifests, features)


def test_dds_used_nothing_beyond_what_its_fabric_ships_with(rbac_audit: AuditRecord) -> None:
    beyond = {}
    for features, used in rbac_audit.dds_used_with.items():
        granted = rbac.granted(with_features(features))
        for grant, test in used.items():
            if grant not in granted and grant not in rbac.EVERY_USER:
                beyond[(features, grant)] = test
    assert not beyond, "DDS was allowed requests the RBAC of its fabric and features does not grant:\n" + "\n".join(
        f"  with {'+'.join(features)}: {grant.describe()} (first by {test})"
        for (features, grant), test in sorted(beyond.items(), key=repr))


@pytest.mark.parametrize("feature", rbac.FABRIC_FEATURES + rbac.OPTIONAL_FEATURES)
def test_the_grants_only_one_fabric_or_feature_ships_are_used_with_it(rbac_audit: AuditRecord, feature: str) -> None:
    # Empty for redfish: its ConfigMap's get/update are manifests/dds's verbs on another resourceName.
    own = rbac.granted(with_features((feature,))) - rbac.granted(with_features(()))
    reasons = incomplete_run(rbac_audit)
    if reasons:
        pytest.skip("not the whole suite, so an unused grant cannot be told from an untested one: " + "; ".join(reasons))
    used = set().union(*(used for features, used in rbac_audit.dds_used_with.items() if feature in features))
    unused = own - used - documented_unexercised()
    assert not unused, (f"manifests/rbac/{feature} grants what no test used with it: "
                        f"{sorted(g.describe() for g in unused)}")
