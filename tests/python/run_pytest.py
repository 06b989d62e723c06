"""Runs one pytest module for ctest and maps "nothing could run here" to a visible skip.

pytest exits 5 when it collects no test, which newer pytest versions (9.x) also do when a module
skips itself at import (pytest.importorskip). ctest would count that as a failure. This runner
prints the skip reasons (-rs) and exits 77 when no test passed or failed and at least one was
skipped (or none was collected), which tests/CMakeLists.txt declares as SKIP_RETURN_CODE, so
ctest lists the test as "Skipped" with the reason in its output instead of failing the run.
The tests' temporary folders (tmp_path) live under one folder per run that is removed at the
end, so that nothing is left in /tmp (pytest keeps its last runs' folders otherwise).
"""
import shutil
import sys
import tempfile

import pytest

SKIP = 77


class Outcomes:
    def __init__(self):
        self.ran = 0
        self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1
        elif report.when == "call":
            self.ran += 1

    def pytest_collectreport(self, report):
        if report.skipped:
            self.skipped += 1


def main(argv):
    outcomes = Outcomes()
    base = tempfile.mkdtemp(prefix="dlrec-pytest-")
    try:
        rc = pytest.main(["-q", "-rs", "-p", "no:cacheprovider", "--basetemp", base, *argv],
                         plugins=[outcomes])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if rc in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and outcomes.ran == 0:
        print(f"run_pytest: SKIPPED, no test could run here ({outcomes.skipped} skipped; "
              "reasons above)", flush=True)
        return SKIP
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
