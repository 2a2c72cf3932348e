"""scripts/benchmark_sweep.py: a sweep against its trials run by hand, in
real processes (2 short trials, `--trials=2`: the figures are not checked,
their shape is)."""

import json
import subprocess
import sys

import pytest

import helpers


@pytest.mark.slow
def test_reports_what_the_sweep_adds_over_its_trials():
  result = subprocess.run(
      [sys.executable, "scripts/benchmark_sweep.py", "--rounds=1",
       "--steps=20", "--trials=2"], cwd=helpers.REPO_ROOT, capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  figures = json.loads(lines[-1].removeprefix("JSON "))
  sweep, loop = figures["seconds"]["sweep"], figures["seconds"]["loop"]
  assert sweep > 0 and loop > 0
  assert figures["added"] == pytest.approx((sweep - loop) / loop, abs=2e-3)
  assert 0 < figures["trial_seconds"] < sweep
  assert figures["beyond_trials"] == pytest.approx(
      sweep - figures["trial_seconds"], abs=0.02)
  assert (figures["target"], figures["rounds"], figures["steps"],
          figures["trials"]) == (0.05, 1, 20, 2)
  assert lines[0].startswith("round 1: sweep ")
  assert lines[-2].startswith(f"sweep {sweep:.1f} s, its 2 trials as "
                              f"train.py commands {loop:.1f} s: ")
