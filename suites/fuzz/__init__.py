"""Hypothesis fuzzing: strategies that draw cases, checks that judge them."""
