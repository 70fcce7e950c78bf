"""The judge's own tests: te_ref against the hand-typed literals, the literal tables themselves, and
the checks against planted defects (a check that cannot fail judges nothing)."""
