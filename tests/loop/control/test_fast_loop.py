"""`fast_loop`: a runner's loop called as Orbit's controller calls it, with
one tensor per loop length, Orbit's summaries only where they go, and the
step reached checked."""

import tensorflow as tf

from trainer.loop.control import fast_loop
from trainer.loop.runner import runners


class _Runner:
  """Records its calls: the steps tensor and whether summaries record."""

  def __init__(self, step):
    self.step = step
    self.calls = []

  def train(self, num_steps):
    # Whether a summary at the loop's first step would be recorded.
    self.calls.append((num_steps, bool(tf.summary.should_record_summaries())))
    self.step.assign_add(tf.cast(num_steps, tf.int64))
    return {"accuracy": tf.constant(0.5)}


class _Manager:
  """Orbit's summary manager, recording what it writes."""

  def __init__(self, directory):
    self.written = []
    self._writer = tf.summary.create_file_writer(directory)

  def summary_writer(self):
    return self._writer

  def write_summaries(self, values):
    self.written.append(values)

  def flush(self):
    self.written.append("flush")


def _loop(tmp_path, orbit_summaries, interval=None, step=0):
  global_step = tf.Variable(step, dtype=tf.int64)
  runner, manager = _Runner(global_step), _Manager(str(tmp_path))
  return (fast_loop.FastLoop(runner, global_step, manager, interval,
                             orbit_summaries), runner, manager)


def test_a_loop_length_is_made_a_tensor_once(tmp_path):
  loop, runner, _ = _loop(tmp_path, orbit_summaries=False)
  assert float(loop.run(2)["accuracy"]) == 0.5
  loop.run(2)
  loop.run(3)
  first, second, third = (steps for steps, _ in runner.calls)
  assert first is second and int(third) == 3


def test_orbit_summaries_record_at_interval_multiples_only(tmp_path):
  loop, runner, _ = _loop(tmp_path, orbit_summaries=True, interval=4, step=2)
  loop.run(2)  # From step 2.
  loop.run(2)  # From step 4.
  assert [recorded for _, recorded in runner.calls] == [False, True]
  loop, runner, _ = _loop(tmp_path, orbit_summaries=True, interval=None)
  loop.run(2)  # From step 0, but no interval.
  assert [recorded for _, recorded in runner.calls] == [False]


def test_written_with_steps_per_second_where_they_go(tmp_path):
  loop, _, manager = _loop(tmp_path, orbit_summaries=True)
  loop.write_summaries({"loss": tf.constant(0.25)}, 10, 2.0)
  assert manager.written == [{"loss": 0.25, "steps_per_second": 5.0},
                             "flush"]
  loop, _, manager = _loop(tmp_path, orbit_summaries=False)
  loop.write_summaries({"loss": 0.25}, 10, 2.0)
  assert manager.written == []


def test_a_loop_that_miscounts_steps_is_reported(tmp_path, capsys):
  loop, _, _ = _loop(tmp_path, orbit_summaries=False, step=7)
  assert loop.step_reached(0, 5, reported=5) == 5
  assert loop.step_reached(0, 5, reported=None) == 7  # Read: 7.
  assert capsys.readouterr().out.splitlines() == [
      "warning | a training loop of 5 step(s) from step 0 reached step 7, "
      "not 5: the runner's `train` must add 1 to the global step per step; "
      "going on from step 7"]


def test_the_output_gets_the_loops_loss_and_rate_where_it_has_none():
  status = runners.LoopStatus(loss=1.5, nonfinite_step=-1,
                              learning_rate=0.1, step=4)
  assert fast_loop.train_output(None, status) == {"loss": 1.5,
                                                  "learning_rate": 0.1}
  assert fast_loop.train_output({"loss": 2.0}, status) == {
      "loss": 2.0, "learning_rate": 0.1}
  no_schedule = runners.LoopStatus(1.5, -1, None, 4)
  assert fast_loop.train_output({}, no_schedule) == {"loss": 1.5}
