"""scripts/benchmark_startup.py: a 1-step digits run of train.py against a
bare TensorFlow script, in real processes; the figures' shape, not their
values."""

import json
import os
import subprocess
import sys

import pytest

import helpers

sys.path.insert(0, os.path.join(helpers.REPO_ROOT, "scripts"))
# pylint: disable=g-import-not-at-top,wrong-import-position
import benchmark_startup  # noqa: E402
from tasks import digits  # noqa: E402


def test_the_bare_model_is_the_tasks():
  # The bare script checks its model has this many parameters.
  assert benchmark_startup.PARAMETERS == (
      digits.DigitsClassification().build_model().count_params())


@pytest.mark.slow  # 13-30 s: two whole processes.
def test_one_pair_prints_the_table_and_the_figures():
  result = subprocess.run(
      [sys.executable, "scripts/benchmark_startup.py", "--runs=1"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  assert lines[0].startswith("start-up of a 1-step digits run, 1 pair(s) of "
                             "fresh processes, load ")
  assert lines[1].split() == ["contender", "median", "min", "max", "cpu",
                              "peak", "(seconds,", "CPU", "seconds,", "MiB)"]
  figures = json.loads(lines[-1].removeprefix("JSON "))
  assert sorted(figures) == ["cpu_ratio", "cpu_seconds", "load", "peak_mib",
                             "peak_ratio", "ratio", "runs", "seconds",
                             "target"]
  assert figures["runs"] == 1 and figures["target"] == 1.25
  seconds, peaks = figures["seconds"], figures["peak_mib"]
  cpu = figures["cpu_seconds"]
  assert sorted(seconds) == sorted(peaks) == sorted(cpu) == ["bare", "ours"]
  assert all(value > 0 for value in [*seconds.values(), *peaks.values(),
                                     *cpu.values()])
  # One pair: the median ratio is that pair's ratio.
  assert figures["ratio"] == seconds["ours"] / seconds["bare"]
  assert figures["cpu_ratio"] == cpu["ours"] / cpu["bare"]
  assert figures["peak_ratio"] == peaks["ours"] / peaks["bare"]
  for row, name in zip(lines[2:4], ["ours", "bare"]):
    # One run: median, min and max are that run's seconds.
    assert row.split() == [name] + [f"{seconds[name]:.2f}"] * 3 + [
        f"{cpu[name]:.2f}", f"{peaks[name]:.0f}"]
  verdict = "PASS" if figures["ratio"] <= 1.25 else "FAIL"
  assert lines[4] == (
      f"ours/bare {figures['ratio']:.3f}x seconds (median of pairs), "
      f"{figures['cpu_ratio']:.3f}x CPU seconds, "
      f"{figures['peak_ratio']:.3f}x peak memory | target <= 1.25x: "
      f"{verdict}")
  assert len(lines) == 6



def test_a_failed_run_or_one_without_checkpoint_stops_the_benchmark(
    tmp_path):
  failing = [sys.executable, "-c", "print('boom'); raise SystemExit(3)"]
  with pytest.raises(RuntimeError) as raised:
    benchmark_startup.run_once("ours", failing, str(tmp_path))
  assert str(raised.value) == "ours exited 3:\nboom\n"
  silent = [sys.executable, "-c", "pass"]
  with pytest.raises(RuntimeError) as raised:
    benchmark_startup.run_once("ours", silent, str(tmp_path))
  assert str(raised.value) == f"ours left no checkpoint in {tmp_path}:\n"
  (tmp_path / "checkpoint").write_text("")
  with pytest.raises(RuntimeError) as raised:
    benchmark_startup.run_once("bare", silent, str(tmp_path))
  assert str(raised.value) == (
      f"bare's model has not {benchmark_startup.PARAMETERS} parameters:\n")
  seconds, peak, cpu = benchmark_startup.run_once("ours", silent,
                                                  str(tmp_path))
  assert seconds > 0 and peak > 1 and cpu > 0
