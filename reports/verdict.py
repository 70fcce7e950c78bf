"""The release verdict of one `python -m te_conformance run`: PASS or FAIL, why, and the exit
code."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """What the gate looks at; PASS only when none of it went wrong.

    A run with no baseline yet is not a failure: its verdict is NO BASELINE (exit 0) when every
    case passed, and FAIL when one failed. Overrides (--accept-loss, --force, --no-compare) never
    hide: each is a line of `overrides`, stored with the verdict in report.json."""

    failing: int = 0  # cases that failed or errored
    pytest_exit: int = 0  # pytest's exit code
    regressions: int = 0  # against the baseline; 0 when this run became the baseline
    baseline: str = ""  # the baseline's path, for the reasons
    baseline_refused: bool = False  # --update-baseline was asked for and refused
    no_baseline: bool = False  # a comparison was wanted, but no baseline exists yet
    unusable_baseline: bool = False  # a baseline file exists but cannot be read
    interrupted: str = ""  # what stopped the run early ("SIGTERM", "KeyboardInterrupt"), if it was
    reported: int = 0  # cases in the report (of a stopped run: those that finished)
    collected: int | None = None  # tests pytest had collected (known for a stopped run)
    passing: int = 0  # cases that passed (the no-baseline verdict quotes it)
    skipped: int = 0  # cases skipped: when every reported case was, nothing was judged
    run_kind: str = ""  # "full" or "subset" (reports.model.Scope.kind)
    overrides: tuple[str, ...] = ()  # gates that were overridden, with the reason given

    @property
    def reasons(self) -> list[str]:
        """Why the verdict is FAIL, one line each (empty otherwise)."""
        # pytest exits 1 exactly when tests failed: the failing count says it better; 2 is the
        # interruption, which its own line says
        pytest_failed = self.pytest_exit != 0 and not (
            (self.pytest_exit == 1 and self.failing) or (self.pytest_exit == 2 and self.interrupted)
        )
        of = f" of {self.collected} collected" if self.collected is not None else ""
        return [
            message
            for wrong, message in (
                (
                    self.interrupted,
                    f"stopped early ({self.interrupted}): the report is partial, "
                    f"{self.reported} case(s){of}",
                ),
                (self.failing, f"{self.failing} failing case(s)"),
                (
                    self.all_skipped,
                    f"every one of the {self.reported} case(s) was skipped: nothing was judged",
                ),
                (pytest_failed, f"pytest exited with code {self.pytest_exit}"),
                (self.regressions, f"{self.regressions} regression(s) against {self.baseline}"),
                (self.baseline_refused, "baseline not updated"),
                (self.unusable_baseline, f"unusable baseline {self.baseline}"),
            )
            if wrong
        ]

    @property
    def all_skipped(self) -> bool:
        """Cases ran and every one of them was skipped: a run that judged nothing (no adapter
        support, no device, kernels that did not load) is never a PASS."""
        return self.reported > 0 and self.skipped >= self.reported

    @property
    def notes(self) -> list[str]:
        """What the verdict says besides its reasons: no baseline, overrides."""
        notes = []
        if self.no_baseline:
            notes.append(f"no baseline: {self.passing} passed, {self.failing} failed")
        return notes + [f"overridden: {o}" for o in self.overrides]

    @property
    def passed(self) -> bool:
        return not self.reasons

    @property
    def status(self) -> str:
        """PASS, FAIL, or NO BASELINE (nothing failed, but nothing to compare with)."""
        if self.reasons:
            return "FAIL"
        return "NO BASELINE" if self.no_baseline else "PASS"

    @property
    def exit_code(self) -> int:
        """0 pass (or no baseline yet, nothing failing); 1 failing cases, regressions, a refused
        update or every case skipped; else pytest's own code (1, 2 interrupted, usage error, no
        tests); 2 stopped early or with an unusable baseline."""
        if self.failing or self.regressions or self.baseline_refused or self.all_skipped:
            return 1
        if self.pytest_exit != 0:
            return self.pytest_exit
        return 2 if self.unusable_baseline or self.interrupted else 0

    def as_dict(self) -> dict:
        """What report.json stores under "verdict"."""
        return {
            "status": self.status,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "reasons": self.reasons,
            "notes": self.notes,
            "overrides": list(self.overrides),
            "baseline": self.baseline,
            "run_kind": self.run_kind,
        }
