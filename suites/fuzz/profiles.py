"""The fuzz profiles, registered with hypothesis: `pytest --hypothesis-profile NAME` picks one.

  ci       the default: a fixed seed (derandomize) and a small budget per device
  gpu      a fixed seed and several times the examples, for a GPU machine
  explore  a random seed each run and many examples, with an example database (.hypothesis/)

register() runs when the suites' pytest plugin loads, before hypothesis reads the option.
"""

from __future__ import annotations

# examples per test: profile -> device -> kind -> count
PROFILES = {
    "ci": {"cpu": {"softmax": 60, "convert": 80, "module": 25},
           "cuda": {"softmax": 150, "convert": 150, "module": 60}},
    "gpu": {"cpu": {"softmax": 150, "convert": 200, "module": 100},
            "cuda": {"softmax": 600, "convert": 500, "module": 250}},
    "explore": {"cpu": {"softmax": 2000, "convert": 2000, "module": 1000},
                "cuda": {"softmax": 4000, "convert": 3000, "module": 2000}},
}  # fmt: skip


def register() -> None:
    """Register the three profiles (a no-op where hypothesis is not installed)."""
    try:
        from hypothesis import HealthCheck, settings
        from hypothesis.database import DirectoryBasedExampleDatabase
    except ImportError:
        return
    for name in PROFILES:
        explore = name == "explore"
        settings.register_profile(
            name,
            # derandomized but for explore; the draws also depend on the constants hypothesis
            # gathers from the modules loaded so far, so the explicit examples are the fixed part
            derandomize=not explore,
            database=DirectoryBasedExampleDatabase(".hypothesis/examples") if explore else None,
            deadline=None,
            print_blob=True,
            report_multiple_bugs=False,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
                HealthCheck.function_scoped_fixture,
            ],
        )


def profile_name() -> str:
    """The profile `--hypothesis-profile` loaded; "ci" for hypothesis' own default (or its
    automatic "ci" when $CI is set, which register() replaces with ours)."""
    from hypothesis import settings

    name = settings.get_current_profile_name()
    return name if name in PROFILES else "ci"
