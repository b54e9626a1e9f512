"""Find out, by trying and not by assuming, what this host offers. Every finding carries its evidence."""

from probes.finding import Finding, Verdict
from probes.host import Host

__all__ = ["Finding", "Host", "Verdict"]
