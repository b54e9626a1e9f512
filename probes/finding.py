"""A finding is a frozen value that carries the evidence it rests on."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

# The default of a record's mapping field: one read-only empty mapping, shared safely.
EMPTY: Mapping[str, Any] = MappingProxyType({})


class Verdict(enum.StrEnum):
    supported = enum.auto()
    denied = enum.auto()  # present, but policy forbids it (EPERM, EACCES, a sysctl at 0)
    unsupported = enum.auto()  # the host lacks it (ENOENT, ENOSYS, EINVAL, no binary)
    detected = enum.auto()  # "am I in X?": yes
    not_detected = enum.auto()  # "am I in X?": no signal fired
    unknown = enum.auto()  # we could not tell: never read as a pass


class _FindingFields(NamedTuple):
    probe: str
    verdict: Verdict
    reason: str  # one line a person can act on
    evidence: Mapping[str, str]
    # Structured facts other code decides from (versions, paths, lists); kept apart from evidence,
    # which is for people.
    facts: Mapping[str, Any]


class Finding(_FindingFields):
    """A probe's answer about one thing on the host, with the evidence it rests on. Immutable, its mappings
    made read-only; `to_json` and `from_json` carry it between processes (conformance/handover.py).

    A NamedTuple, as every record on the probe, witness and run paths (docs/architecture.md, "Records"):
    on Python 3.11 a frozen dataclass costs ~0.5-1 ms to create at import and pulls in `inspect`."""

    __slots__ = ()

    def __new__(cls, probe: str, verdict: Verdict, reason: str, evidence: Mapping[str, str] = EMPTY,
                facts: Mapping[str, Any] = EMPTY) -> Finding:
        if "\n" in reason:
            raise ValueError(f"{probe}: a reason is one line: {reason!r}")
        return super().__new__(cls, probe, verdict, reason,
                               MappingProxyType({k: str(v) for k, v in evidence.items()}),
                               MappingProxyType(dict(facts)))

    def _replace(self, **changes: Any) -> Finding:
        # NamedTuple's own _replace builds the tuple directly, past the checks above.
        return Finding(**{**self._asdict(), **changes})

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
