"""A recording stand-in for Transformer Engine (tests/test_te_adapter.py); not TE."""

__version__ = "2.18.0+stand-in"
