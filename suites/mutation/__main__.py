"""`python -m suites.mutation`: see suites/mutation/harness.py."""

from suites.mutation.harness import main

if __name__ == "__main__":
    raise SystemExit(main())
