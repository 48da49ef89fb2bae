"""Kubernetes resource.Quantity parsing, without the kubernetes client (the pure core must not import it)."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


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
    try:
        amount = Decimal(number)
    except InvalidOperation as exc:
        raise QuantityError(f"not a quantity: {value!r}") from exc
    multiplier = _BINARY.get(suffix)
    return amount * (Decimal(multiplier) if multiplier else _DECIMAL[suffix])


def to_milli(value: str | int | float) -> int:
    """CPU quantities in millicores, rounded up as the apiserver does (0.0001 cpu -> 1m)."""
    return int(math.ceil(parse_quantity(value) * 1000))


def to_int(value: str | int | float) -> int:
    """Byte or count quantities, rounded up to a whole unit."""
    return int(math.ceil(parse_quantity(value)))


def format_milli(milli: int) -> str:
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"
