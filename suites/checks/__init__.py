"""What the suites check on one result: numerics (SPEC §6), contracts, attention, invariances."""
