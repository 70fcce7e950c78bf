"""Thin shim: the suites' pytest plugin is suites/plugin.py (options, markers, seeding, pinning,
known failures, the report plugin). An installed project registers it through its `pytest11`
entry point under this same name, so naming it here too registers it once; this line is what
loads it where the entry point is not installed or autoloading is off."""

pytest_plugins = ["te_conformance.suites.plugin"]
