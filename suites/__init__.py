"""Conformance suites: case generation, implementation adapters, numerics and the test files."""
