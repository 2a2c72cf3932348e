"""scripts/benchmark_streaming.py run as a user runs it, at small sizes."""

import json
import subprocess
import sys

import pytest

import helpers


# A process (~40 s); the streaming itself is tests/data/test_streaming.py.
@pytest.mark.slow
def test_the_window_keeps_no_images_in_the_checkpoint_and_mixes_classes():
  result = subprocess.run(
      [sys.executable, "scripts/benchmark_streaming.py", "--window=300",
       "--images=96", "--image_size=32", "--batch=16", "--batches=3",
       "--rounds=2", "--classes=10", "--per_class=60", "--files=5"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  figures = json.loads(lines[-1].removeprefix("JSON "))
  speed, quality = figures["speed"], figures["quality"]
  assert set(speed["batches_per_s"]) == {"stream", "buffer"}
  assert all(rate > 0 for rate in speed["batches_per_s"].values())
  assert speed["stream_over_buffer"] > 0
  # The buffer holds up to 300 encoded images (each several KB); the
  # stream's state is positions and counters.
  assert speed["state_bytes"]["stream"] < 16 * 1024
  assert speed["state_bytes"]["buffer"] > 50 * speed["state_bytes"]["stream"]
  for way in ("window", "buffer"):
    # Stored class by class, a batch of 16 would hold 1 or 2 classes
    # unshuffled; both mix them, a uniform draw gives ~8.1.
    assert 3 < quality[way]["classes_per_batch"] <= 10
    assert 0 < quality[way]["travel_mean"] <= quality[way]["travel_p99"]
  assert quality["window"]["travel_p99"] < 300  # Never beyond the window.
  assert abs(quality["uniform_classes_per_batch"] - 8.15) < 0.01
  assert "stream / buffer speed:" in result.stdout
