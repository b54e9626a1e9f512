"""Find out, by trying and not by assuming, what this host offers. Every finding carries its evidence."""

from sandbox_conformance.probes.finding import Finding, Verdict
from sandbox_conformance.probes.host import Host

__all__ = ["Finding", "Host", "Verdict"]
