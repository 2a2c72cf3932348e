"""The train reporter hook: the progress line, its ETA and the summaries
after each loop, read back."""

import os

import pytest
import tensorflow as tf

from trainer import console
from trainer.loop.control import hooks as loop_hooks
from trainer.loop.control import reporter as reporter_lib

import helpers


def test_format_duration():
  assert reporter_lib.format_duration(3.4) == "3s"
  assert reporter_lib.format_duration(123) == "2m03s"
  assert reporter_lib.format_duration(3723) == "1h02m03s"


def test_progress_line():
  line = reporter_lib.progress_line(300, 1000, 250.04, 16002.6, 0.12345, 2.8)
  assert line == ("train | step  300/1000 |   250.0 steps/s |    16003 "
                  "examples/s | loss 0.1235 | ETA 3s")
  assert reporter_lib.progress_line(1, 10, 1.0, 1.0, float("nan"),
                                 None).endswith("loss nan | ETA ?")


def test_progress_bar_fits_the_terminals_width():
  bar = reporter_lib.progress_bar(300, 1000, 250.04, 0.12345, 2.8)
  assert bar == ("step  300/1000 [#####.............]  30% | 250.0 "
                 "steps/s | loss 0.1235 | ETA 3s")
  assert len(bar) == 79
  assert reporter_lib.progress_bar(10, 10, 1.0, None, None, columns=200) == (
      "step 10/10 [##############################] 100% | 1.0 steps/s | "
      "loss ? | ETA ?")
  # Never narrower than 10: the console cuts what a terminal cannot show.
  assert "[###.......]" in reporter_lib.progress_bar(3, 10, 1.0, 0.5, 1.0,
                                                     columns=40)


class _Clock:
  """Seconds that advance only when told."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def _after_loop(reporter, step, num_steps, seconds, loss, learning_rate,
                read_metrics):
  """Reports a loop to `reporter` as the controller does."""
  reporter.after_loop(step, loop_hooks.LoopResult(
      num_steps=num_steps, seconds=seconds, loss=loss,
      learning_rate=learning_rate, output={"loss": loss},
      read_metrics=read_metrics))


def _reporter(tmp_path, clock, **overrides):
  settings = dict(train_steps=40, global_batch_size=8, summary_interval=20)
  settings.update(overrides)
  writer = tf.summary.create_file_writer(str(tmp_path))
  return reporter_lib.TrainReporter(writer, clock=clock, **settings)


def test_reporter_progress_line_and_eta_after_the_first_loop(tmp_path,
                                                              capsys):
  clock = _Clock()
  reporter = _reporter(tmp_path, clock)
  metrics = lambda: {"loss": 0.5, "learning_rate": 0.1}  # noqa: E731
  for step in (10, 20, 30):
    clock.now += 2.0
    _after_loop(reporter, step, 10, 1.0, 0.5, None, metrics)
  lines = capsys.readouterr().out.splitlines()
  # 10 steps in 1 s of loop time; the ETA counts the clock: 20 steps in 4 s
  # since the first loop, 10 steps to go.
  assert lines[0] == ("train | step 10/40 |    10.0 steps/s |       80 "
                      "examples/s | loss 0.5000 | ETA ?")
  assert lines[1].endswith("ETA 4s") and lines[2].endswith("ETA 2s")


def test_reporter_writes_summaries_at_interval_multiples_and_the_end(
    tmp_path):
  reads = []

  def metrics():
    reads.append(len(reads))
    return {"loss": 0.25, "learning_rate": 0.1, "input_wait_seconds": 0.5}

  reporter = _reporter(tmp_path, _Clock(), train_steps=50)
  for step in (10, 20, 30, 40, 50):
    _after_loop(reporter, step, 10, 2.0, 0.25, None, metrics)
  scalars = helpers.read_scalars(str(tmp_path))
  assert [step for step, _ in scalars["loss"]] == [20, 40, 50]
  assert len(reads) == 3  # Metrics are read (and reset) only then.
  # 20 steps in 4 s of loop time; 0.5 s of it waiting for input.
  assert scalars["steps_per_second"][0] == (20, 5.0)
  assert scalars["examples_per_second"][0] == (20, 40.0)
  assert scalars["input_wait_fraction"][0] == (20, 0.125)
  # The last window is the single loop to step 50.
  assert scalars["steps_per_second"][-1] == (50, 5.0)


def test_reporter_writes_a_changed_learning_rate_between_summaries(tmp_path):
  reporter = _reporter(tmp_path, _Clock())
  metrics = lambda: {"loss": 1.0, "learning_rate": 0.25}  # noqa: E731
  for step, rate in ((10, 0.5), (20, 0.375), (30, 0.25), (40, 0.25)):
    _after_loop(reporter, step, 10, 1.0, 1.0, rate, metrics)
  scalars = helpers.read_scalars(str(tmp_path))
  # Step 10: changed; 20 and 40: in the summaries (the rate they read);
  # 30: the same as the last one written.
  assert scalars["learning_rate"] == [(10, 0.5), (20, 0.25), (40, 0.25)]


def test_reporter_warns_once_when_input_bound(tmp_path, capsys):
  reporter = _reporter(tmp_path, _Clock(), summary_interval=10)
  # Half of each 1 s loop of 10 steps: 50 ms a step.
  metrics = lambda: {"loss": 1.0, "input_wait_seconds": 0.5}  # noqa: E731
  _after_loop(reporter, 10, 10, 1.0, 1.0, None, metrics)
  _after_loop(reporter, 20, 10, 1.0, 1.0, None, metrics)
  out = capsys.readouterr().out
  assert out.count("warning | input-bound: the steps to 10 waited for input "
                   "50% of the time (50.0 ms a step); scripts/benchmark_"
                   "input.py times the pipeline alone, and the performance "
                   "guide lists remedies.") == 1
  assert out.count("input-bound") == 1


def test_reporter_ignores_a_wait_not_worth_acting_on(tmp_path, capsys):
  reporter = _reporter(tmp_path, _Clock(), summary_interval=10)
  # Half of each 10 ms loop of 10 steps: 0.5 ms a step, what taking a
  # prefetched batch costs a tiny model.
  metrics = lambda: {"loss": 1.0, "input_wait_seconds": 0.005}  # noqa: E731
  _after_loop(reporter, 10, 10, 0.01, 1.0, None, metrics)
  assert "input-bound" not in capsys.readouterr().out
  assert helpers.read_scalars(str(tmp_path))["input_wait_fraction"] == [
      (10, pytest.approx(0.5))]


def test_reporter_ignores_a_toy_models_large_share_of_a_small_wait(tmp_path,
                                                                   capsys):
  reporter = _reporter(tmp_path, _Clock(), summary_interval=10)
  # A toy Task on 2 replicas: 74% of 1.4 ms steps waiting, 1.04 ms a step
  # (seen: "74% of the time (1.0 ms a step)"); a millisecond a step is
  # nothing worth acting on.
  metrics = lambda: {"loss": 1.0, "input_wait_seconds": 0.0104}  # noqa: E731
  _after_loop(reporter, 10, 10, 0.014, 1.0, None, metrics)
  assert "input-bound" not in capsys.readouterr().out
  assert helpers.read_scalars(str(tmp_path))["input_wait_fraction"] == [
      (10, pytest.approx(0.0104 / 0.014))]


def test_reporter_warns_where_the_same_share_is_a_large_wait(tmp_path,
                                                             capsys):
  reporter = _reporter(tmp_path, _Clock(), summary_interval=10)
  # The same share of 50 ms steps: 37 ms a step waiting.
  metrics = lambda: {"loss": 1.0, "input_wait_seconds": 0.37}  # noqa: E731
  _after_loop(reporter, 10, 10, 0.5, 1.0, None, metrics)
  assert [line for line in capsys.readouterr().out.splitlines()
          if line.startswith("warning |")] == [
              "warning | input-bound: the steps to 10 waited for input 74% "
              "of the time (37.0 ms a step); scripts/benchmark_input.py "
              "times the pipeline alone, and the performance guide lists "
              "remedies."]


def test_reporter_bar_is_redrawn_and_kept_at_the_end(tmp_path, capsys,
                                                     monkeypatch):
  monkeypatch.setattr(console.shutil, "get_terminal_size",
                      lambda: os.terminal_size((200, 24)))
  reporter = _reporter(tmp_path, _Clock(), train_steps=20, bar=True)
  metrics = lambda: {"loss": 0.5}  # noqa: E731
  _after_loop(reporter, 10, 10, 1.0, 0.5, None, metrics)
  _after_loop(reporter, 20, 10, 1.0, 0.25, None, metrics)
  reporter.end(20)
  assert capsys.readouterr().out == (
      "\r\x1b[Kstep 10/20 [###############...............]  50% | 10.0 "
      "steps/s | loss 0.5000 | ETA ?"
      "\r\x1b[Kstep 20/20 [##############################] 100% | 10.0 "
      "steps/s | loss 0.2500 | ETA 0s\n")


def test_reporter_gives_each_summary_to_the_summary_functions(tmp_path):
  given = []
  reporter = _reporter(tmp_path, _Clock(),
                       summary_fns=[lambda step, scalars: given.append(
                           (step, scalars))])
  metrics = lambda: {"loss": 0.5, "accuracy": 0.75}  # noqa: E731
  for step in (10, 20):
    _after_loop(reporter, step, 10, 2.0, 0.5, None, metrics)
  assert given == [(20, {"loss": 0.5, "accuracy": 0.75,
                         "steps_per_second": 5.0,
                         "examples_per_second": 40.0})]
