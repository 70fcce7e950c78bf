"""The conformance suites: every test takes an ``adapter`` (any implementation, through
suites/adapters) and judges it against te_ref; ``--impl`` selects these tests by that fact."""
