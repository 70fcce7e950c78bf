"""``python -m te_conformance``: the report tool's command line (te_conformance.reports)."""

import sys

from te_conformance.reports.__main__ import main

sys.exit(main())
