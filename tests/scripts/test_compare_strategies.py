"""scripts/compare_strategies.py: one task under its default runtime variants
(the Tools page's command), each in its own process, the table of their
figures, and a variant that fails."""

import json
import os
import subprocess
import sys

import pytest

import helpers

sys.path.insert(0, helpers.REPO_ROOT + "/scripts")
import compare_strategies  # noqa: E402  pylint: disable=g-import-not-at-top


def _run(*args):
  result = subprocess.run(
      [sys.executable, *args], cwd=helpers.REPO_ROOT, capture_output=True,
      text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  return lines, json.loads(lines[-1].removeprefix("JSON "))


@pytest.mark.slow  # 40 s: five training processes and mnist's fake data.
def test_the_documented_defaults_train_in_their_own_processes():
  # The Tools page's command (shortened as tests/test_docs.py shortens it),
  # whose block is marked as run here.
  command = helpers.page_command("tools.md", "compare_strategies.py")
  assert command == ["scripts/compare_strategies.py", "gin/mnist.gin",
                     "--fake_data=4000", "--steps=200"]
  lines, figures = _run(*command, "--steps=20")
  names = ["one device", "mirrored, 2 logical CPUs", "bfloat16", "float16",
           "XLA"]
  assert list(figures) == names
  for name in names:
    assert figures[name]["steps_per_second"] > 0, name
    assert figures[name]["examples_per_second"] == pytest.approx(
        128 * figures[name]["steps_per_second"], rel=0.05), name
    assert 0 < figures[name]["final_loss"] < 2.5, name  # ln 10 = 2.3 at start.
    assert 100 < figures[name]["peak_memory_mib"] < 8000, name
  table = lines[-7:-1]
  assert table[0].split() == ["variant", "steps/s", "examples/s", "final",
                              "loss", "peak", "MiB"]
  assert [row.startswith(name) for row, name in zip(table[1:], names)] == [
      True] * 5


@pytest.mark.slow  # 10 s: one training process that fails.
def test_a_variant_that_fails_is_its_row_and_its_error():
  lines, figures = _run("scripts/compare_strategies.py", "gin/digits.gin",
                        "--steps=40", "--variant=broken=runtime.num_gpus=-1")
  assert list(figures) == ["broken"]
  assert "must not be negative" in figures["broken"]["error"]
  assert lines[-2].startswith("broken") and "failed: " in lines[-2]


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


def test_the_scalars_are_read_from_a_url(tmp_path, monkeypatch):
  """A run's summaries at a URL (here `ram://`) are read there."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  log_dir = f"ram://{tmp_path.name}/variant0/train"
  with tf.summary.create_file_writer(log_dir).as_default():
    for step, rate in [(10, 2.0), (20, 3.0)]:
      tf.summary.scalar("steps_per_second", rate, step=step)
  assert compare_strategies.read_scalars(log_dir) == {
      "steps_per_second": [(10, 2.0), (20, 3.0)]}
  assert not os.listdir(tmp_path)
