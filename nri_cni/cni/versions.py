"""CNI spec versions: which ones nri-cni speaks and how they compare."""

from __future__ import annotations

from collections.abc import Iterable

# The spec versions with a released result format; libcni's version.Current() is the last.
SUPPORTED = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
CURRENT = "1.1.0"


def parse(version: str) -> tuple[int, int, int]:
    """Parses "X[.Y[.Z]]" as libcni does; "" means 0.1.0 (no version declared)."""
    if version == "":
        return (0, 1, 0)
    parts = version.split(".")
    if len(parts) > 3:
        raise ValueError(f"invalid version {version!r}: too many parts")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"invalid version {version!r}") from None
    nums += [0] * (3 - len(nums))
    return (nums[0], nums[1], nums[2])


def at_least(version: str, other: str) -> bool:
    return parse(version) >= parse(other)


def negotiate(declared: str, candidates: Iterable[str]) -> str:
    """The highest version nri-cni supports among `declared` and `candidates`.

    Versions above CURRENT are dropped (a newer config may still be usable at an older
    version); a version that is not a real spec release is dropped too. Raises ValueError
    when nothing usable is left or an entry does not parse.
    """
    pool = list(candidates)
    if declared:
        pool.append(declared)
    if not pool:
        return "0.1.0"  # no version declared at all: the spec's original
    for v in pool:
        parse(v)
    usable = [v for v in pool if v in SUPPORTED]
    if not usable:
        raise ValueError(f"no supported CNI version among {pool} (supported: {', '.join(SUPPORTED)})")
    return max(usable, key=parse)
