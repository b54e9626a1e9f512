"""A finding is a frozen value that carries the evidence it rests on."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


class Verdict(enum.StrEnum):
    supported = enum.auto()
    denied = enum.auto()  # present, but policy forbids it (EPERM, EACCES, a sysctl at 0)
    unsupported = enum.auto()  # the host lacks it (ENOENT, ENOSYS, EINVAL, no binary)
    detected = enum.auto()  # "am I in X?": yes
    not_detected = enum.auto()  # "am I in X?": no signal fired
    unknown = enum.auto()  # we could not tell: never read as a pass


@dataclasses.dataclass(frozen=True)
class Finding:
    """A probe's answer about one thing on the host, with the evidence it rests on. Frozen, its mappings made
    read-only; `to_json` and `from_json` carry it between processes (conformance/handover.py)."""

    probe: str
    verdict: Verdict
    reason: str  # one line a person can act on
    evidence: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Structured facts other code decides from (versions, paths, lists); kept apart from evidence,
    # which is for people.
    facts: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if "\n" in self.reason:
            raise ValueError(f"{self.probe}: a reason is one line: {self.reason!r}")
        object.__setattr__(self, "evidence", MappingProxyType({k: str(v) for k, v in self.evidence.items()}))
        object.__setattr__(self, "facts", MappingProxyType(dict(self.facts)))

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.supported

    def to_json(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "verdict": str(self.verdict),
            "reason": self.reason,
            "evidence": dict(self.evidence),
            "facts": dict(self.facts),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Finding:
        return cls(
            probe=doc["probe"],
            verdict=Verdict(doc["verdict"]),
            reason=doc["reason"],
            evidence=doc.get("evidence", {}),
            facts=doc.get("facts", {}),
        )
