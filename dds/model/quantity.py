"""Kubernetes resource.Quantity parsing, without the kubernetes client (the pure core must not import it)."""

from __future__ import annotations

import math
import re
from decimal import Decimal, Overflow
from types import MappingProxyType

_BINARY = MappingProxyType({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60})
_DECIMAL = MappingProxyType({"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
                             "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
                             "P": Decimal(10**15), "E": Decimal(10**18)})
# Far above the largest Kubernetes quantity (2^63-1, about 9.2e18), and low enough that turning a value into an int
# stays cheap: "1e999999" would otherwise build a million-digit integer (half a minute of CPU).
_MAX_EXPONENT = 40
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


class QuantityTooLarge(QuantityError):
    """A quantity far beyond any Kubernetes quantity (the largest is 2^63-1)."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse '500m', '16Gi', '1e3', 4 into an exact Decimal."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    text = value.strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"not a quantity: {value!r}")
    number, suffix = match.group(1), match.group(2) or ""
    if "e" in number.lower() and suffix:
        raise QuantityError(f"not a quantity: {value!r}")
    multiplier = _BINARY.get(suffix)
    try:
        amount = Decimal(number) * (Decimal(multiplier) if multiplier else _DECIMAL[suffix])
    except Overflow as exc:  # an exponent past Decimal's range
        raise QuantityTooLarge(f"quantity too large: {value!r}") from exc
    except ArithmeticError as exc:
        raise QuantityError(f"not a quantity: {value!r}") from exc
    if amount.adjusted() > _MAX_EXPONENT:
        raise QuantityTooLarge(f"quantity too large: {value!r}")
    return amount


def to_milli(value: str | int | float) -> int:
    """CPU quantities in millicores, rounded up as the apiserver does (0.0001 cpu -> 1m)."""
    return int(math.ceil(parse_quantity(value) * 1000))


def to_int(value: str | int | float) -> int:
    """Byte or count quantities, rounded up to a whole unit."""
    return int(math.ceil(parse_quantity(value)))


def format_milli(milli: int) -> str:
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


_BYTE_RESOURCES = ("memory", "ephemeral-storage")
_GIB, _MIB = 1 << 30, 1 << 20


def human_amount(resource: str, value: int) -> str:
    """An amount as people read it: CPU (kept in millicores) as cores, memory and storage (bytes) in GiB or MiB,
    anything else (pods, GPUs, nodes) as the count."""
    if resource == "cpu":
        cores = value / 1000
        return f"{cores:g} core" if cores == 1 else f"{cores:g} cores"
    if resource in _BYTE_RESOURCES or resource.startswith("hugepages-"):
        for size, unit in ((_GIB, "GiB"), (_MIB, "MiB")):
            if abs(value) >= size:
                return f"{value / size:.4g} {unit}"
        return f"{value} B"
    return str(value)
