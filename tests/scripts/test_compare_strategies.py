"""scripts/compare_strategies.py: one task under two runtime variants, each
in its own process, and the table of their figures."""

import json
import subprocess
import sys

import pytest

import helpers

sys.path.insert(0, helpers.REPO_ROOT + "/scripts")
import compare_strategies  # noqa: E402  pylint: disable=g-import-not-at-top


@pytest.mark.slow  # 28 s: three training processes.
def test_variants_train_in_their_own_processes():
  result = subprocess.run(
      [sys.executable, "scripts/compare_strategies.py", "gin/digits.gin",
       "--steps=40",
       "--variant=one device=runtime.distribution_strategy='one_device'",
       "--variant=mirrored=gin/runtime/cpu_mirrored.gin",
       "--variant=broken=runtime.num_gpus=-1"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  figures = json.loads(lines[-1].removeprefix("JSON "))
  assert list(figures) == ["one device", "mirrored", "broken"]
  for name in ("one device", "mirrored"):
    assert figures[name]["steps_per_second"] > 0
    assert figures[name]["examples_per_second"] == pytest.approx(
        64 * figures[name]["steps_per_second"], rel=0.05)
    assert 0 < figures[name]["final_loss"] < 2.3  # It learned something.
    assert 100 < figures[name]["peak_memory_mib"] < 8000
  assert "must not be negative" in figures["broken"]["error"]
  table = lines[-5:-1]
  assert table[0].split() == ["variant", "steps/s", "examples/s", "final",
                              "loss", "peak", "MiB"]
  assert table[3].startswith("broken") and "failed: " in table[3]


def test_parse_variant():
  assert compare_strategies.parse_variant(
      "fp16=gin/runtime/cpu.gin,runtime.mixed_precision_dtype='float16'") == (
          "fp16", ["gin/runtime/cpu.gin"],
          ["runtime.mixed_precision_dtype='float16'"])
  with pytest.raises(ValueError, match="is not NAME=ITEM"):
    compare_strategies.parse_variant("no-items")


def test_a_malformed_variant_is_one_line():
  result = subprocess.run(
      [sys.executable, "scripts/compare_strategies.py", "gin/digits.gin",
       "--variant=no-items"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  # The error line is the last; TensorFlow may log before it (no CUDA).
  assert result.stderr.strip().splitlines()[-1] == (
      "compare_strategies.py: error: --variant 'no-items' is not "
      "NAME=ITEM,ITEM,...")
