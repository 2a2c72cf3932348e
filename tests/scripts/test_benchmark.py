"""scripts/benchmark.py: our runner against a bare loop, Orbit and Keras, in
a real process: each command docs/precision-and-performance.md and
docs/tools.md show (one_device, and mirrored on both pages), shortened as
tests/test_docs.py shortens it; their blocks are marked as run here."""

import json
import subprocess
import sys

import pytest

import helpers

CONTENDERS = ["ours", "bare", "orbit", "keras"]
PAGES = ("precision-and-performance.md", "tools.md")


def _page_commands():
  """The arguments of each `python scripts/benchmark.py` line of PAGES (a
  comment for the reader left out), each command once."""
  found = []
  for page in PAGES:
    for command in helpers.page_commands(page, "benchmark.py"):
      if command not in found:
        found.append(command)
  return found


def test_the_pages_show_one_command_per_strategy():
  assert _page_commands() == [["scripts/benchmark.py"],
                              ["scripts/benchmark.py", "--strategy=mirrored"]]


@pytest.mark.slow  # 25-49 s: a whole benchmark process.
@pytest.mark.parametrize("strategy, replicas", [
    ("one_device", "OneDeviceStrategy, 1 replica(s)"),
    ("mirrored", "MirroredStrategy, 2 replica(s)")])
def test_reports_every_contender_and_its_ratio_to_bare(strategy, replicas):
  command = _page_commands()[strategy == "mirrored"]
  result = subprocess.run(
      [sys.executable, *command, "--rounds=1", "--steps=100"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  assert lines[0].startswith(
      f"strategy {strategy} ({replicas}), global batch "), lines[0]
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
