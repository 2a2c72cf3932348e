"""scripts/benchmark_resume.py run as a user runs it, at small sizes."""

import json
import subprocess
import sys

import pytest

import helpers


# A process (~15 s); the measurement itself is tests/data/test_input_state.py.
@pytest.mark.slow
def test_the_buffer_grows_with_the_shuffle_and_the_global_shuffle_does_not():
  result = subprocess.run(
      [sys.executable, "scripts/benchmark_resume.py", "--sizes=200,2000",
       "--image_side=8", "--steps=3", "--repeats=1",
       "--resume_steps=10,300"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=240)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  rows = json.loads(lines[-1].removeprefix("JSON "))["rows"]
  state = {(row["shuffle"], row["way"]): row["bytes"] for row in rows}
  assert all(row["same_next_batch"] for row in rows)
  # 8x8x3 uint8 images are 192 B: the buffer holds them, the global
  # shuffle a few counters whatever its size.
  assert state[2000, "buffer"] > 2000 * 192
  assert state[2000, "buffer"] > 3 * state[200, "buffer"]
  assert state[200, "global shuffle"] < 2048
  assert state[2000, "global shuffle"] < 2048
  assert lines[0].split() == ["shuffle", "way", "input", "state", "save",
                              "s", "restore", "s", "same", "next", "batch"]
  # Each worker's pipeline resumed both ways at each step, to the batch
  # the saved run read next.
  figures = json.loads(lines[-1].removeprefix("JSON "))
  resumes = figures["resumes"]
  assert [(row["step"], row["worker"]) for row in resumes] == [
      (10, 0), (10, 1), (300, 0), (300, 1)]
  assert all(row["same_next_batch"] and row["skip_s"] > 0 and
             row["position_s"] > 0 for row in resumes)
  assert figures["position_last_over_first"] > 0
  assert ("saved position: resume at step 300 over at step 10: "
          in result.stdout)
