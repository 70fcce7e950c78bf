"""Tools that run on a GPU machine: A/B, bits, ncu, profiles."""
