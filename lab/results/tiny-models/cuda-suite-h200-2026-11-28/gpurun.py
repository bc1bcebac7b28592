"""pytest plugin for the device run: a smaller derandomized Hypothesis profile, and every
failure's report written to $OUT/failures.txt as it arrives (xdist prints them only at the end)."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("gpu", derandomize=True, deadline=None,
                          max_examples=int(os.environ.get("GPU_EXAMPLES", "8")),
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                          print_blob=True)


def pytest_runtest_logreport(report):
    if report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        path = os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("FAIL_FILE", "failures.txt"))
        with open(path, "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext[-5000:]}\n")
