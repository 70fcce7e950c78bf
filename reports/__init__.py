"""Conformance reports: a pytest plugin, the report JSON, rendering, baseline comparison."""
