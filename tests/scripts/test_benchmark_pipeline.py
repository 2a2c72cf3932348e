"""scripts/benchmark_pipeline.py: the pipeline against naive model
parallelism, in a real process (a tiny model: the figures are not
checked, their shape and the ideal are)."""

import json
import subprocess
import sys

import pytest

import helpers


@pytest.mark.slow  # A run of the script: 10 s.
def test_reports_each_micro_batch_count_beside_the_ideal():
  result = subprocess.run(
      [sys.executable, "scripts/benchmark_pipeline.py", "--rounds=1",
       "--steps=1", "--width=32", "--batch=32", "--microbatches=2,8"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  figures = json.loads(lines[-1].removeprefix("JSON "))
  assert (figures["stages"], figures["microbatches"]) == (2, 8)
  assert figures["ideal"] == round(2 * 8 / 9, 3) == 1.778
  assert figures["speedup_vs_naive"] > 0
  assert sorted(figures["all"]) == ["M=2", "M=8", "naive", "one_device",
                                    "serial"]
  assert figures["speedup_vs_serial"] == (
      figures["all"]["M=8"]["speedup_vs_serial"])
  assert figures["all"]["serial"]["speedup_vs_serial"] == 1.0
  assert figures["all"]["serial"]["overlap"] is None
  assert figures["all"]["M=2"]["ideal"] == 1.333
  assert figures["all"]["naive"]["speedup_vs_naive"] == 1.0
  assert all(figures["peak_bytes"][k] > 0 for k in ("kept", "recomputed"))
  assert figures["all"]["naive"]["cpu_vs_naive"] == 1.0
  assert all(0 <= each["overlap"] <= 1 and each["cpu_vs_naive"] > 0
             for name, each in figures["all"].items() if name != "serial")
  rows = [line.split() for line in lines
          if line.split()[:1] in (["naive"], ["serial"], ["M=2"], ["M=8"])]
  assert [row[0] for row in rows] == ["naive", "serial", "M=2", "M=8"]
  assert [row[4] for row in rows] == ["1.00", "1.00", "1.33", "1.78"]
