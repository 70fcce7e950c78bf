"""`python -m tools.mutation`: see tools/mutation/harness.py."""

from tools.mutation.harness import main

if __name__ == "__main__":
    raise SystemExit(main())
