"""scripts/benchmark_mixture.py: a mixture's step time against its first
source's alone, in a real process on the shipped mixture."""

import json
import statistics
import subprocess
import sys

import pytest

import helpers


def _run(*args):
  return subprocess.run(
      [sys.executable, "scripts/benchmark_mixture.py", *args],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_reports_both_step_times_and_their_ratio():
  result = _run("gin/digits_mixture.gin", "--steps=20", "--rounds=2",
                "--gin_param=trainer.steps_per_loop=10")
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()[-6:]
  assert lines[0] == ("DigitsMixture: global batch 64, steps_per_loop 10, 2 "
                      "round(s) of 20 steps each, median")
  assert lines[1].split() == ["contender", "ms/step", "min", "max"]
  assert [line.split()[0] for line in lines[2:4]] == ["mixture", "one"]
  figures = json.loads(lines[5].removeprefix("JSON "))
  assert set(figures["ms_per_step"]) == {"mixture", "one source"}
  assert all(ms > 0 for ms in figures["ms_per_step"].values())
  assert len(figures["round_ratios"]) == 2
  assert figures["step_time_ratio"] == statistics.median(
      figures["round_ratios"])
  verdict = "PASS" if figures["step_time_ratio"] <= 1.05 else "FAIL"
  assert lines[4] == ("step time, mixture / one source: "
                      f"{figures['step_time_ratio']:.3f}x (target <= 1.05x: "
                      f"{verdict})")


@pytest.mark.slow
def test_a_configuration_without_a_mixture_is_one_line():
  result = _run("gin/digits.gin", "--rounds=1")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "benchmark_mixture.py: error: the configuration trains on one dataset: "
      "give a Task whose `build_inputs(training=True)` returns sources by "
      "name, and their rates (`trainer.mixture`), e.g. "
      "gin/digits_mixture.gin.")
