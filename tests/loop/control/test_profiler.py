"""Profiling a window of steps: loops cut at its edges, a real trace."""

import glob
import os
import shutil

import pytest

import trainer
from trainer import experiment
from trainer.loop.control import profiler

import helpers


def test_loops_are_cut_at_the_window_edges():
  window = profiler.ProfileWindow((25, 40), "/unused")
  assert window.clip(0, 10) == 10
  assert window.clip(20, 10) == 5  # 20 -> 25: the trace starts at 25.
  assert window.clip(25, 10) == 10
  assert window.clip(35, 10) == 5  # 35 -> 40: it ends at 40.
  assert window.clip(40, 10) == 10


def test_the_trace_covers_the_window(tmp_path, capsys):
  config = trainer.TrainerConfig(
      train_steps=40, steps_per_loop=10, summary_interval=10,
      checkpoint_interval=40, global_batch_size=32, profile_steps=(15, 25))
  experiment.run(helpers.LinearRegression(), "train", str(tmp_path),
                 trainer.RuntimeConfig(seed=0), config)
  out = capsys.readouterr().out
  assert f"profile | steps 15 to 25 traced into {tmp_path}/train" in out
  # Loops end at the window's edges (15, 25) and multiples of 10.
  steps = [int(line.split()[3].split("/")[0]) for line in out.splitlines()
           if line.startswith("train | step")]
  assert steps == [10, 15, 20, 25, 30, 40]
  traces = glob.glob(os.path.join(tmp_path, "train", "plugins", "profile",
                                  "*", "*.xplane.pb"))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0


def test_no_trace_goes_into_a_model_dir_deleted_under_the_run(tmp_path):
  model_dir = tmp_path / "run"

  def window_over(delete_at):
    """Profiles steps 0 to 10 of a made `model_dir`, deleting it before the
    window (`before`), in it (`during`) or not at all."""
    model_dir.mkdir()
    window = profiler.ProfileWindow((0, 10), str(model_dir / "train"),
                                    model_dir=str(model_dir))
    if delete_at == "before":
      model_dir.rmdir()
    window.before_loop(0)
    if delete_at == "during":
      model_dir.rmdir()
    window.after_loop(10, None)
    return window

  kept = window_over(None)
  assert kept.traced and glob.glob(
      str(model_dir / "train" / "plugins" / "profile" / "*" / "*.xplane.pb"))
  shutil.rmtree(model_dir)
  for delete_at in ("during", "before"):
    assert not window_over(delete_at).traced, delete_at
    assert not model_dir.exists(), delete_at


def test_check_steps():
  profiler.check_steps(None)
  profiler.check_steps((0, 1))
  for steps in ((1, 1), [5], (0, True), "0,1"):
    with pytest.raises(trainer.ConfigError) as raised:
      profiler.check_steps(steps)
    assert str(raised.value) == (
        f"`trainer.profile_steps` ({steps!r}) must be (start, end) with "
        "0 <= start < end.")
