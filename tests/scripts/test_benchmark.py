"""scripts/benchmark.py: our runner against a bare loop, Orbit and Keras, in
a real process: the command docs/tools.md shows, shortened as
tests/test_docs.py shortens it (its block is marked as run here; the same
command in docs/precision-and-performance.md, and the one_device one, run
there)."""

import json
import os
import re
import subprocess
import sys

import pytest

import helpers

CONTENDERS = ["ours", "bare", "orbit", "keras"]


def _tools_page_command():
  """The arguments of docs/tools.md's `python scripts/benchmark.py` line."""
  with open(os.path.join(helpers.REPO_ROOT, "docs", "tools.md"),
            encoding="utf-8") as f:
    found = re.findall(r"^python (scripts/benchmark\.py\b.*)$", f.read(),
                       re.M)
  assert len(found) == 1, found
  return found[0].split()


@pytest.mark.slow  # 25-49 s: a whole benchmark process.
def test_reports_every_contender_and_its_ratio_to_bare():
  command = _tools_page_command()
  assert command == ["scripts/benchmark.py", "--strategy=mirrored"]
  result = subprocess.run(
      [sys.executable, *command, "--rounds=1", "--steps=100"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  assert lines[0].startswith(
      "strategy mirrored (MirroredStrategy, 2 replica(s)), global batch "), (
          lines[0])
  figures = json.loads(lines[-1].removeprefix("JSON "))
  assert sorted(figures) == ["steps_per_loop_1", "steps_per_loop_100",
                             "vs_bare"]
  for steps_per_loop, target in (("100", 1.0), ("1", 0.97)):
    key = f"steps_per_loop_{steps_per_loop}"
    rates, ratios = figures[key], figures["vs_bare"][key]
    assert sorted(rates) == sorted(CONTENDERS) == sorted(ratios)
    assert all(rate > 0 for rate in rates.values())
    # One round: the median ratio is that round's ratio.
    for name in CONTENDERS:
      assert ratios[name] == rates[name] / rates["bare"], name
    row = next(line for line in lines if line.startswith("ours ") and
               f"target >= {target:.2f}x" in line)
    verdict = "PASS" if ratios["ours"] >= target else "FAIL"
    assert row.split()[1:] == [f"{rates['ours']:.1f}", f"{rates['ours']:.1f}",
                               f"{rates['ours']:.1f}",
                               f"{ratios['ours']:.3f}x", "target", ">=",
                               f"{target:.2f}x:", verdict]
