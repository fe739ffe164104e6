"""pytest plugin entry (filled in by the conformance issue)."""
