"""When a verify round runs CNI CHECK besides netlink: a pure policy, no clock, no I/O.

netlink sees the pod's side in ~0.3 ms per pod; CHECK runs every plugin of the chain (~10 ms and
up per pod) and is the only judge of the host side (bridge, veth peer, rules). So rounds run every
`interval` seconds with netlink only, and each attachment gets a CHECK every `check_every` rounds,
or at once when netlink found a difference. The CHECKs due are spread over the rounds by a stable
hash of the attachment's key, so 500 pods cost ~500/check_every CHECKs a round, not 500 every
`check_every` rounds.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VerifyPolicy:
    interval: float = 30.0  # verify.interval: seconds between netlink rounds
    check_every: int = 10  # each attachment's CHECK every this many rounds

    @classmethod
    def of(cls, cfg: Any) -> VerifyPolicy:
        """From the config's verify section (its interval 0: no timer; rounds on demand still)."""
        return cls(interval=cfg.verify_interval or 30.0, check_every=cfg.verify_check_every)

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ValueError(f"verify interval must be positive, not {self.interval!r}")
        if self.check_every < 1:
            raise ValueError(f"check_every must be at least 1, not {self.check_every!r}")

    @property
    def check_period(self) -> float:
        """The longest an attachment goes without a CHECK while netlink sees nothing wrong."""
        return self.interval * self.check_every

    def slot(self, key: str) -> int:
        """The round (modulo check_every) in which `key`'s cadence CHECK falls; stable across
        restarts (crc32, not the per-process salted hash)."""
        return zlib.crc32(key.encode()) % self.check_every

    def check_due(self, key: str, round_no: int) -> bool:
        return round_no % self.check_every == self.slot(key)

    def needs_check(self, key: str, round_no: int, *, differs: bool, forced: bool = False) -> bool:
        """CHECK this attachment in round `round_no`? `differs`: netlink found it damaged this round;
        `forced`: asked for by hand (`nri-cni verify`)."""
        return forced or differs or self.check_due(key, round_no)
