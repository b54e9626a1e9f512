"""pytest plugin (pytest11 entry point `sandbox_conformance`)."""
