"""The mutation harness: plant catalogued defects, run the suites, require each to be caught."""
