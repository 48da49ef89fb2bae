"""The image build is reproducible: the Dockerfile names its base image by digest and installs only what
requirements.lock pins with hashes, and the lock pins every dependency pyproject.toml declares, at a version the
declaration allows (`make image-lock` re-makes it)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"


def locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, hashes) of each requirement in the lock."""
    pins: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())  # one requirement a line
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"^([A-Za-z0-9._-]+)==([^\s;]+)", line)
        assert match, f"not an exact pin: {line}"
        pins[canonicalize_name(match.group(1))] = (match.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return pins


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(spec) for spec in project["dependencies"]]


def test_every_locked_requirement_is_an_exact_pin_with_hashes() -> None:
    pins = locked()
    assert pins
    assert {name for name, (_, hashes) in pins.items() if not hashes} == set()


def test_every_dependency_of_dds_is_locked_at_a_version_it_allows() -> None:
    pins = locked()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock: run `make image-lock`"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), \
            f"requirements.lock pins {name}=={pins[name][0]}, pyproject.toml asks {requirement}: run `make image-lock`"


def test_the_dockerfile_builds_from_a_digest_and_installs_only_hash_checked_files() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, flags=re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", base.group(1)), base
    assert re.findall(r"^FROM (\S+)", text, flags=re.MULTILINE) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert "--require-hashes" in text and "-r requirements.lock" in text
    assert "--no-build-isolation" in text  # DDS's build backend is the base image's, not one fetched unpinned
    assert "--no-index" in text  # the runtime stage installs the hash-checked wheels only
    assert "!requirements.lock" in (ROOT / ".dockerignore").read_text()
