"""compute-sanitizer runs over te_fast's ops and module."""
