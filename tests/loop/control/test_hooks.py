"""The loop hook protocol: what the controller calls, in which order, around
its loops, saves, rollbacks, early stops and evaluations. Driven by fakes:
each test runs in milliseconds."""

import signal

import orbit
import pytest
import tensorflow as tf

import trainer
from trainer import preemption
from trainer.loop.control import controller as controller_lib
from trainer.loop.control import hooks as loop_hooks
from trainer.loop.control import rollback
from trainer.loop.runner import runners


class _Loop(orbit.runner.AbstractTrainer):
  """A runner that switches the controller to its own loop: each step adds
  1 to the global step; the loop through step `nonfinite_at` stops there
  with a non-finite loss, once. Skipped batches are recorded in `events`."""

  def __init__(self, events, nonfinite_at=None):
    self.step = tf.Variable(0, dtype=tf.int64)
    self.events = events
    self.nonfinite_at = nonfinite_at
    self.in_loop = False
    self._nonfinite = -1

  def train(self, num_steps):
    start = int(self.step.numpy())
    end = start + int(num_steps)
    if self.nonfinite_at is not None and start < self.nonfinite_at <= end:
      end = self._nonfinite = self.nonfinite_at
      self.nonfinite_at = None
    self.step.assign(end)
    return {"loss": tf.constant(0.5)}

  def loop_status(self):
    nonfinite, self._nonfinite = self._nonfinite, -1
    return runners.LoopStatus(0.5, nonfinite, None, int(self.step.numpy()))

  def discard_batch(self):
    self.events.append(("discard",))

  def read_and_reset_metrics(self):
    return {"loss": 0.5}


class _Evaluator(orbit.runner.AbstractEvaluator):

  def __init__(self, events, step):
    self.events = events
    self.step = step

  def evaluate(self, num_steps):
    self.events.append(("evaluate", int(self.step.numpy())))
    return {"accuracy": 0.5}


class _Manager(tf.train.CheckpointManager):
  """Records every save in `events`."""

  def __init__(self, events, step, directory):
    super().__init__(tf.train.Checkpoint(step=step), directory,
                     max_to_keep=None)
    self.events = events

  def save(self, checkpoint_number=None, check_interval=True, options=None):
    self.events.append(("save", int(checkpoint_number)))
    return super().save(checkpoint_number, check_interval, options)


class _Recording(loop_hooks.LoopHook):
  """Records every call in `events`; clips loops at `clip_at`, stops once
  the step reaches `stop_at` (as `stop_reason` sees it)."""

  def __init__(self, events, name="", clip_at=None, stop_at=None):
    self.events = events
    self.name = name
    self.clip_at = clip_at
    self.stop_at = stop_at
    self.results = []
    self._step = 0

  def _record(self, *call):
    self.events.append((self.name + call[0],) + call[1:])

  def clip(self, step, num_steps):
    self._record("clip", step, num_steps)
    if self.clip_at is not None and step < self.clip_at < step + num_steps:
      return self.clip_at - step
    return num_steps

  def before_loop(self, step):
    self._record("before_loop", step)

  def after_loop(self, step, result):
    self._step = step
    self.results.append(result)
    self._record("after_loop", step, result.num_steps, result.loss)

  def after_rollback(self, step):
    self._step = step
    self._record("after_rollback", step)

  def stop_reason(self):
    self._record("stop_reason")
    if self.stop_at is not None and self._step >= self.stop_at:
      return f"step {self._step} is enough"
    return None

  def end(self, step):
    self._record("end", step)


def _controller(loop, hooks, manager=None, **kwargs):
  return controller_lib.Controller(
      trainer=loop, global_step=loop.step,
      strategy=tf.distribute.get_strategy(), checkpoint_manager=manager,
      options=controller_lib.ControllerOptions(checkpoint_interval=10),
      hooks=hooks, **kwargs)


def test_a_hook_does_nothing_by_default():
  hook = loop_hooks.LoopHook()
  result = loop_hooks.LoopResult(num_steps=10, seconds=0.1, loss=0.5,
                                 learning_rate=None, output={"loss": 0.5},
                                 read_metrics=dict)
  assert hook.clip(0, 10) == 10 and hook.clip(7, 3) == 3
  assert [hook.before_loop(0), hook.after_loop(10, result),
          hook.after_rollback(0), hook.stop_reason(), hook.end(10)] == [
              None] * 5
  with pytest.raises(AttributeError):
    result.loss = 1.0  # A record: what every hook of a loop sees alike.


def test_a_run_calls_hooks_around_every_loop_and_before_each_save(tmp_path):
  events = []
  loop = _Loop(events)
  hook = _Recording(events)
  controller = _controller(loop, [hook], _Manager(events, loop.step,
                                                  str(tmp_path)),
                           steps_per_loop=10)
  controller.train(30)
  assert events == [
      ("stop_reason",), ("clip", 0, 10), ("before_loop", 0),
      ("after_loop", 10, 10, 0.5), ("save", 10),
      ("stop_reason",), ("clip", 10, 10), ("before_loop", 10),
      ("after_loop", 20, 10, 0.5), ("save", 20),
      ("stop_reason",), ("clip", 20, 10), ("before_loop", 20),
      ("after_loop", 30, 10, 0.5), ("save", 30),
      ("end", 30)]  # Step 30 is saved: not again at completion.
  result = hook.results[0]
  assert result.seconds >= 0 and result.learning_rate is None
  # The runner's output, as the train actions get it.
  assert float(result.output["loss"]) == 0.5
  assert result.read_metrics() == {"loss": 0.5}


def test_hooks_clip_in_turn_and_the_first_reason_stops(tmp_path, capsys):
  events = []
  loop = _Loop(events)
  controller = _controller(
      loop, [_Recording(events, "a.", clip_at=15),
             _Recording(events, "b.", clip_at=12, stop_at=20)],
      _Manager(events, loop.step, str(tmp_path)), steps_per_loop=10)
  controller.train(50)
  assert events == [
      ("a.stop_reason",), ("b.stop_reason",),
      ("a.clip", 0, 10), ("b.clip", 0, 10),
      ("a.before_loop", 0), ("b.before_loop", 0),
      ("a.after_loop", 10, 10, 0.5), ("b.after_loop", 10, 10, 0.5),
      ("save", 10),
      ("a.stop_reason",), ("b.stop_reason",),
      # a cuts the loop from 10 at 15, then b the rest at 12.
      ("a.clip", 10, 10), ("b.clip", 10, 5),
      ("a.before_loop", 10), ("b.before_loop", 10),
      ("a.after_loop", 12, 2, 0.5), ("b.after_loop", 12, 2, 0.5),
      ("a.stop_reason",), ("b.stop_reason",),
      ("a.clip", 12, 8), ("b.clip", 12, 3),
      ("a.before_loop", 12), ("b.before_loop", 12),
      ("a.after_loop", 15, 3, 0.5), ("b.after_loop", 15, 3, 0.5),
      ("a.stop_reason",), ("b.stop_reason",),
      ("a.clip", 15, 5), ("b.clip", 15, 5),
      ("a.before_loop", 15), ("b.before_loop", 15),
      ("a.after_loop", 20, 5, 0.5), ("b.after_loop", 20, 5, 0.5),
      ("save", 20),
      # b gives a reason: no loop more, and not asked again.
      ("a.stop_reason",), ("b.stop_reason",),
      ("a.end", 20), ("b.end", 20)]
  assert controller.stop_reason == "step 20 is enough"
  assert controller.step == 20
  assert "train | stopping early at step 20: step 20 is enough" in (
      capsys.readouterr().out.splitlines())


def test_a_rollback_is_told_to_hooks_and_the_bad_batch_skipped(tmp_path,
                                                               capsys):
  events = []
  loop = _Loop(events, nonfinite_at=17)
  controller = _controller(
      loop, [_Recording(events)], _Manager(events, loop.step, str(tmp_path)),
      steps_per_loop=10,
      guard=rollback.NonFiniteGuard("rollback", max_rollbacks=1))
  controller.train(20)
  assert events == [
      ("save", 0),  # Something to roll back to.
      ("stop_reason",), ("clip", 0, 10), ("before_loop", 0),
      ("after_loop", 10, 10, 0.5), ("save", 10),
      ("stop_reason",), ("clip", 10, 10), ("before_loop", 10),
      # The loss of step 17 is not finite: back to step 10, no after_loop.
      ("after_rollback", 10),
      # The guard ends the next loop before the bad batch, and skips it.
      ("stop_reason",), ("clip", 10, 10), ("before_loop", 10),
      ("after_loop", 16, 6, 0.5),
      ("stop_reason",), ("clip", 16, 4), ("discard",), ("before_loop", 16),
      ("after_loop", 20, 4, 0.5), ("save", 20),
      ("end", 20)]
  out = capsys.readouterr().out.splitlines()
  assert out == [
      "saved checkpoint " + str(tmp_path / "ckpt-0"),
      "saved checkpoint " + str(tmp_path / "ckpt-10"),
      "restored checkpoint " + str(tmp_path / "ckpt-10") + " at step 10",
      "train | non-finite loss at step 17: rolled back to step 10, skipping "
      "that step's batch (rollback 1 of 1)",
      "train | skipped the batch of step 17",
      "saved checkpoint " + str(tmp_path / "ckpt-20")]


def test_train_and_evaluate_ends_each_stretch_before_its_evaluation():
  events = []
  loop = _Loop(events)
  controller = controller_lib.Controller(
      trainer=loop, evaluator=_Evaluator(events, loop.step),
      global_step=loop.step, strategy=tf.distribute.get_strategy(),
      steps_per_loop=5, hooks=[_Recording(events)])
  controller.train_and_evaluate(train_steps=20, eval_steps=1,
                                eval_interval=10)
  assert [event for event in events
          if event[0] in ("after_loop", "end", "evaluate")] == [
              ("after_loop", 5, 5, 0.5), ("after_loop", 10, 5, 0.5),
              ("end", 10), ("evaluate", 10),
              ("after_loop", 15, 5, 0.5), ("after_loop", 20, 5, 0.5),
              ("end", 20), ("evaluate", 20)]


def test_a_signal_saves_the_step_reached_and_ends_without_end(tmp_path):
  events = []
  loop = _Loop(events)
  controller = None
  watcher = preemption.PreemptionWatcher(
      exit_code=75, progress_fn=lambda: controller.progress())

  class SignalDuringSecondLoop(loop_hooks.LoopHook):

    def after_loop(self, step, result):
      if step == 15:
        watcher.defer(signal.SIGTERM)  # As the receiver does.

  controller = _controller(
      loop, [_Recording(events), SignalDuringSecondLoop()],
      _Manager(events, loop.step, str(tmp_path)), steps_per_loop=5,
      preemption=watcher)
  assert watcher.progress() == (0, None)  # Nothing saved yet.
  with pytest.raises(trainer.Preempted) as raised:
    controller.train(40)
  assert (raised.value.step, raised.value.exit_code) == (15, 75)
  # Saved at 10 (the interval) and at 15 (for the signal), then stopped:
  # no more loops, and no `end` (training did not end, it was cut).
  assert [event for event in events if event[0] in ("save", "end")] == [
      ("save", 10), ("save", 15)]
  assert events[-2:] == [("after_loop", 15, 5, 0.5), ("save", 15)]
  # What the receiver's exit line would say: step 15, saved.
  assert watcher.progress() == (15, 15)


def test_a_signal_in_the_last_loop_says_only_the_evaluation_is_left(
    tmp_path):
  events = []
  loop = _Loop(events)
  watcher = preemption.PreemptionWatcher(exit_code=42)

  class SignalInLastLoop(loop_hooks.LoopHook):

    def after_loop(self, step, result):
      if step == 10:
        watcher.defer(signal.SIGTERM)  # A sweep's pruner, say.

  controller = controller_lib.Controller(
      trainer=loop, evaluator=_Evaluator(events, loop.step),
      global_step=loop.step, strategy=tf.distribute.get_strategy(),
      steps_per_loop=5, hooks=[_Recording(events), SignalInLastLoop()],
      checkpoint_manager=_Manager(events, loop.step, str(tmp_path)),
      preemption=watcher)
  with pytest.raises(trainer.Preempted) as raised:
    controller.train_and_evaluate(train_steps=10, eval_steps=1,
                                  eval_interval=5)
  assert (raised.value.step, raised.value.last) == (10, True)
  assert raised.value.line() == (
      "preempted at step 10, the last: checkpoint saved; training is over, "
      "and only its final evaluation is left: run the same command again "
      "to make it (exit code 42)")
  # Stopped midway, it is the resume line as before.
  midway = preemption.PreemptionWatcher(exit_code=42)
  midway.defer(signal.SIGTERM)
  assert midway.stopped(5).line() == (
      "preempted at step 5: checkpoint saved; run the same command again "
      "to resume (exit code 42)")


def test_a_signal_during_end_still_saves_the_final_step(tmp_path):
  events = []
  loop = _Loop(events)
  watcher = preemption.PreemptionWatcher()

  class SignalAtEnd(loop_hooks.LoopHook):

    def end(self, step):
      watcher.defer(signal.SIGINT)  # Ctrl-C after the last loop's check.

  controller = _controller(
      loop, [_Recording(events), SignalAtEnd()],
      _Manager(events, loop.step, str(tmp_path)), steps_per_loop=4,
      preemption=watcher)
  with pytest.raises(trainer.Preempted) as raised:
    controller.train(6)
  assert (raised.value.step, raised.value.asked) == (6, True)
  assert [event for event in events if event[0] in ("save", "end")] == [
      ("end", 6), ("save", 6)]  # The final save, once: then it stops.
