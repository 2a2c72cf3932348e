"""The controller's own behaviour: progress lines, summary and checkpoint
cadence, restore."""

import glob
import itertools
import os
import re
import time

import numpy as np
import orbit
import pytest
import tensorflow as tf

import trainer
from tasks import digits
from trainer import experiment
from trainer.loop.control import controller as controller_lib
from trainer.loop.runner import runners

import helpers


def _run(model_dir, **overrides):
  settings = dict(train_steps=20, steps_per_loop=5, summary_interval=10,
                  global_batch_size=16, checkpoint_interval=10, max_to_keep=10)
  settings.update(overrides)
  return experiment.run(helpers.LinearRegression(), "train", model_dir,
                        trainer.RuntimeConfig(seed=0),
                        trainer.TrainerConfig(**settings))


def test_one_progress_line_per_loop(tmp_path, capsys):
  _run(str(tmp_path))
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith("train | step ")]
  assert [int(re.match(r"train \| step\s+(\d+)/20", l).group(1))
          for l in lines] == [5, 10, 15, 20]
  assert lines[0].endswith("ETA ?")  # The first loop includes tracing.
  assert all(re.search(r"\| loss \d+\.\d{4} \| ETA \d+s$", l)
             for l in lines[1:])


def test_summaries_only_every_summary_interval(tmp_path):
  _run(str(tmp_path), train_steps=25)
  scalars = helpers.read_scalars(os.path.join(str(tmp_path), "train"))
  # Every 10 steps, and at the final step.
  assert [step for step, _ in scalars["loss"]] == [10, 20, 25]
  assert [step for step, _ in scalars["mae"]] == [10, 20, 25]


def test_checkpoints_at_interval_multiples_and_the_end(tmp_path):
  _run(str(tmp_path), train_steps=25, steps_per_loop=5)
  state = tf.train.get_checkpoint_state(str(tmp_path))
  assert [p.rsplit("-", 1)[1] for p in state.all_model_checkpoint_paths] == [
      "10", "20", "25"]


def test_initialize_runs_only_when_starting_from_scratch(tmp_path):
  calls = []

  class Counting(helpers.LinearRegression):

    def initialize(self, model, warm_start=None):
      calls.append(model.name)

  config = trainer.TrainerConfig(train_steps=10, steps_per_loop=5,
                                 summary_interval=5, global_batch_size=16)
  experiment.run(Counting(), "train", str(tmp_path), None, config)
  assert len(calls) == 1
  experiment.run(Counting(), "train", str(tmp_path), None,
                 trainer.TrainerConfig(train_steps=20, steps_per_loop=5,
                                       summary_interval=5,
                                       global_batch_size=16))
  assert len(calls) == 1
  assert helpers.checkpoint_step(str(tmp_path)) == 20


def test_restoring_a_different_model_names_the_variable(tmp_path):
  _run(str(tmp_path))

  class Wider(helpers.LinearRegression):

    def build_model(self):
      import tf_keras  # pylint: disable=g-import-not-at-top
      return tf_keras.Sequential([tf_keras.Input((4,)),
                                  tf_keras.layers.Dense(16, "tanh"),
                                  tf_keras.layers.Dense(1)])

  before = helpers.snapshot(str(tmp_path))
  with pytest.raises(trainer.ConfigError,
                     match=r"^checkpoint \S+/ckpt-20 does not fit this model: "
                     r"variable dense_\d+/bias has shape \(16,\) in this "
                     r"model but \(8,\) in the checkpoint: a model of "
                     r"another shape cannot resume this run; train in a new "
                     r"--model_dir starting from the weights that fit: "
                     r"`warm_start.checkpoint = '\S+/ckpt-20'` \(and "
                     r"`warm_start.modules`\)\.$"):
    experiment.run(Wider(), "train", str(tmp_path), None,
                   trainer.TrainerConfig(train_steps=40, steps_per_loop=5,
                                         summary_interval=5,
                                         global_batch_size=16))
  assert helpers.snapshot(str(tmp_path)) == before  # Nothing written.


class _NanAtStep(helpers.LinearRegression):
  """Batch number `bad_step` (1-based, 32 examples each, first epoch) holds
  NaN features, so exactly that step's loss is NaN."""

  def __init__(self, bad_step):
    super().__init__(num_examples=32 * 150)
    self.bad_step = bad_step

  def build_inputs(self, training, input_context=None):
    features, labels = next(iter(super().build_inputs(training).batch(
        self.num_examples)))
    if training:
      rows = tf.range(self.num_examples)[:, None]
      bad = (rows >= 32 * (self.bad_step - 1)) & (rows < 32 * self.bad_step)
      features = tf.where(bad, float("nan"), features)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def _nan_run(model_dir, strategy="one_device", **overrides):
  settings = dict(train_steps=100, steps_per_loop=100, summary_interval=100,
                  checkpoint_interval=100, global_batch_size=32)
  settings.update(overrides)
  return experiment.run(
      _NanAtStep(37), "train", model_dir,
      trainer.RuntimeConfig(distribution_strategy=strategy, seed=0,
                            num_cpu_devices=2 if strategy == "mirrored" else 0),
      trainer.TrainerConfig(**settings))


def _all_checkpoints_finite(model_dir):
  prefixes = [p[:-len(".index")] for p in os.listdir(model_dir)
              if p.endswith(".index")]
  for prefix in prefixes:
    for value in helpers.checkpoint_numbers(
        os.path.join(model_dir, prefix)).values():
      assert np.all(np.isfinite(value)), prefix
  return len(prefixes)


def test_nan_loss_stops_at_its_step_inside_a_loop(tmp_path):
  model_dir = str(tmp_path)
  with pytest.raises(trainer.NonFiniteError,
                     match=r"^the training loss is not finite at step 37; "
                     r"no checkpoint was saved before it\.$") as raised:
    _nan_run(model_dir)
  assert raised.value.step == 37
  # The 100-step loop stopped at step 37; nothing was saved after it.
  assert _all_checkpoints_finite(model_dir) == 0
  assert not os.path.exists(os.path.join(model_dir, "train"))


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_rollback_skips_the_bad_batch_and_finishes(tmp_path, capsys,
                                                   strategy):
  model_dir = str(tmp_path)
  _nan_run(model_dir, strategy, on_nonfinite="rollback")
  out = capsys.readouterr().out
  assert ("train | non-finite loss at step 37: rolled back to step 0, "
          "skipping that step's batch (rollback 1 of 3)") in out
  assert "train | skipped the batch of step 37" in out
  assert helpers.checkpoint_step(model_dir) == 100
  assert _all_checkpoints_finite(model_dir) == 2  # ckpt-0 and ckpt-100.
  # Exactly one batch was thrown away, and it is in the checkpoint.
  numbers = helpers.checkpoint_numbers(model_dir)
  assert numbers["discarded_batches/.ATTRIBUTES/VARIABLE_VALUE"] == 1


def test_rollbacks_are_limited(tmp_path):
  with pytest.raises(trainer.NonFiniteError,
                     match="not finite at step 37 after 0 rollback"):
    _nan_run(str(tmp_path), on_nonfinite="rollback", max_rollbacks=0)


class _InfGradientAtStep(_NanAtStep):
  """Finite data and loss everywhere; the gradient of step `bad_step` is
  infinite (its batch is marked with features of 1000)."""

  def build_inputs(self, training, input_context=None):
    dataset = super().build_inputs(training, input_context)
    return dataset.map(lambda x, y: (tf.where(tf.math.is_nan(x), 1000.0, x),
                                     y))

  def compute_gradients(self, inputs, model, optimizer):
    loss, grads, outputs = super().compute_gradients(inputs, model, optimizer)
    marked = tf.reduce_any(inputs[0] == 1000.0)
    grads = [tf.where(marked, float("inf"), g) for g in grads]
    return loss, grads, outputs


def test_an_infinite_gradient_stops_at_its_own_step(tmp_path):
  with pytest.raises(trainer.NonFiniteError,
                     match=r"not finite at step 37; no checkpoint was "
                     r"saved before it\.$") as raised:
    experiment.run(
        _InfGradientAtStep(37), "train", str(tmp_path),
        trainer.RuntimeConfig(seed=0),
        trainer.TrainerConfig(train_steps=100, steps_per_loop=100,
                              summary_interval=100, checkpoint_interval=100,
                              global_batch_size=32))
  assert raised.value.step == 37


class _SlowInput(helpers.LinearRegression):
  """Each example takes 2 ms to produce, one at a time: ~64 ms a batch,
  against well under a millisecond of training."""

  def build_inputs(self, training, input_context=None):
    def slow(x, y):
      time.sleep(0.002)
      return x, y

    return super().build_inputs(training, input_context).map(
        lambda x, y: tf.numpy_function(slow, [x, y], [tf.float32, tf.float32],
                                       stateful=False),
        num_parallel_calls=1).map(
            lambda x, y: (tf.ensure_shape(x, [4]), tf.ensure_shape(y, [1])))


def _input_wait(model_dir, task, capsys):
  experiment.run(task, "train", str(model_dir), trainer.RuntimeConfig(seed=0),
                 trainer.TrainerConfig(train_steps=20, steps_per_loop=10,
                                       summary_interval=10,
                                       checkpoint_interval=20,
                                       global_batch_size=32))
  fractions = helpers.read_scalars(str(model_dir / "train"))[
      "input_wait_fraction"]
  return [value for _, value in fractions], capsys.readouterr().out


def test_input_bound_training_is_measured_and_reported(tmp_path, capsys):
  slow, out = _input_wait(tmp_path / "slow", _SlowInput(), capsys)
  # The first window also holds the tracing of the loop.
  assert len(slow) == 2 and slow[0] > 0.2 and slow[1] > 0.8
  line = [l for l in out.splitlines() if "input-bound" in l]
  # Both windows were input-bound; the advice is given once, short.
  assert len(line) == 1 and len(line[0]) < 200, line
  assert re.fullmatch(
      r"warning \| input-bound: the steps to 10 waited for input \d+% of the "
      r"time \((\d+\.\d) ms a step\); scripts/benchmark_input.py times the "
      r"pipeline alone, and the performance guide lists remedies\.", line[0])
  assert float(re.search(r"\((\S+) ms", line[0]).group(1)) > 10
  # A tiny model waits for any input, about a fifth of its time (0.196 in
  # one run, too close to assert), but only the cost of taking a batch:
  # nothing worth acting on, so no warning (the rule alone, without timing:
  # test_summaries' test_reporter_ignores_a_wait_not_worth_acting_on).
  _, out = _input_wait(tmp_path / "tiny", helpers.LinearRegression(), capsys)
  assert "input-bound" not in out
  # Digits' in-memory pipeline keeps ahead of its CNN (a linear model's
  # steps are as short as a batch's preparation: no use here).
  fast, out = _input_wait(tmp_path / "fast", digits.DigitsClassification(),
                          capsys)
  assert all(fraction < 0.2 for fraction in fast), fast
  assert "input-bound" not in out


class _WaitingTrainer(orbit.runner.AbstractTrainer):
  """A loop blocked on its input (`in_loop`), as the stall watch sees it."""

  in_loop = True

  def train(self, num_steps):
    raise AssertionError("not run")


class _OvertakenManager(tf.train.CheckpointManager):
  """Its first save lets the loop take one more step meanwhile: the batch
  came back while the stall watch saved."""

  def __init__(self, step, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._global = step
    self.overtaken = False

  def save(self, *args, **kwargs):
    path = super().save(*args, **kwargs)
    if not self.overtaken:
      self.overtaken = True
      self._global.assign_add(1)
    return path


def test_a_save_while_waiting_overtaken_by_a_step_says_nothing(tmp_path):
  step = tf.Variable(0, dtype=tf.int64)
  weights = tf.Variable(1.0)
  manager = _OvertakenManager(step, tf.train.Checkpoint(step=step, w=weights),
                              str(tmp_path), max_to_keep=5)
  controller = controller_lib.Controller(
      trainer=_WaitingTrainer(), global_step=step,
      strategy=tf.distribute.get_strategy(), checkpoint_manager=manager,
      steps_per_loop=1)
  step.assign(7)  # The loop trained 7 steps, then its input stopped.
  # A batch came during the save: the checkpoint may mix steps 7 and 8, so
  # the timeout is not reported (the watch waits again).
  assert controller.save_while_waiting() is None
  # Still stuck at step 8: saved and reported.
  assert controller.save_while_waiting() == "the checkpoint of step 8 is saved"
  assert helpers.latest_step(str(tmp_path)) == 8
  # Nothing new: not saved twice.
  assert controller.save_while_waiting() == "the checkpoint of step 8 is saved"
  assert manager.latest_checkpoint.endswith("ckpt-8")


def test_a_save_while_waiting_after_the_loop_came_back_says_nothing(tmp_path):
  # The loop's input came back and the loop ended: the controller saves and
  # acts on a signal itself; the stall watch neither saves nor ends the run.
  step = tf.Variable(7, dtype=tf.int64)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step),
                                       str(tmp_path), max_to_keep=5)
  trainer = _WaitingTrainer()
  controller = controller_lib.Controller(
      trainer=trainer, global_step=step,
      strategy=tf.distribute.get_strategy(), checkpoint_manager=manager,
      steps_per_loop=1)
  trainer.in_loop = False
  assert controller.save_while_waiting() is None
  assert manager.latest_checkpoint is None


class _FakeLoop(orbit.runner.AbstractTrainer):
  """A runner that switches the Controller to its own loop and runs in
  microseconds: each step adds 1 to the global step (or what `advance`
  says, for a loop that miscounts) and records `inside` with `tf.summary`,
  as a `train_step` may; `train` returns `output`."""

  def __init__(self, step, output=None, advance=None, reports_step=True,
               learning_rate=None):
    self.step = step
    self.output = output
    self.advance = advance or (lambda num_steps: num_steps)
    self.reports_step = reports_step
    self.learning_rate = learning_rate
    self.in_loop = False
    self.loops = []  # Steps asked, per call of `train`.

  def train(self, num_steps):
    self.loops.append(int(num_steps))
    for _ in range(self.advance(int(num_steps))):
      self.step.assign_add(1)
      tf.summary.scalar("inside", 1.0, step=self.step)
    return self.output

  def loop_status(self):
    return runners.LoopStatus(
        0.5, -1, self.learning_rate,
        int(self.step.numpy()) if self.reports_step else None)

  def discard_batch(self):
    raise AssertionError("no batch is skipped here")

  def read_and_reset_metrics(self):
    return {"loss": 0.5}


def _fake_controller(trainer, model_dir=None, manager=None, **kwargs):
  return controller_lib.Controller(
      trainer=trainer, global_step=trainer.step,
      strategy=tf.distribute.get_strategy(), checkpoint_manager=manager,
      **kwargs)


def _event_steps(log_dir):
  """{tag: [step, ...]} of every summary in `log_dir`."""
  steps = {}
  for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        steps.setdefault(value.tag, []).append(event.step)
  return {tag: sorted(found) for tag, found in steps.items()}


def test_the_own_loop_writes_orbit_summaries_into_summary_dir(tmp_path):
  recorded = []
  fake = _FakeLoop(tf.Variable(0, dtype=tf.int64),
                   output={"loss": tf.constant(0.25), "penalty": 3.0},
                   learning_rate=0.01)
  controller = _fake_controller(
      fake, steps_per_loop=2, summary_interval=4,
      summary_dir=str(tmp_path / "summaries"), train_actions=[recorded.append])
  controller.train(8)
  assert fake.loops == [2, 2, 2, 2]  # Our own loop ran every loop.
  steps = _event_steps(str(tmp_path / "summaries"))
  # As Orbit: what the runner records inside `train` at multiples of
  # `summary_interval` (`record_if`); its output and steps/s every loop.
  assert steps == {"inside": [4, 8], "loss": [2, 4, 6, 8],
                   "penalty": [2, 4, 6, 8], "learning_rate": [2, 4, 6, 8],
                   "steps_per_second": [2, 4, 6, 8]}
  losses = helpers.read_scalars(str(tmp_path / "summaries"))["loss"]
  assert [value for _, value in losses] == [0.25] * 4  # The runner's own.
  # Train actions get the runner's whole output, unconverted, and the
  # loop's scheduled rate; the runner's `loss` wins over the status's.
  assert len(recorded) == 4
  assert all(sorted(output) == ["learning_rate", "loss", "penalty"]
             for output in recorded)
  assert isinstance(recorded[0]["loss"], tf.Tensor)
  assert float(recorded[0]["loss"]) == 0.25
  assert recorded[0]["penalty"] == 3.0
  assert recorded[0]["learning_rate"] == 0.01


def test_the_own_loop_without_summary_dir_writes_nothing(tmp_path, capsys):
  recorded = []
  fake = _FakeLoop(tf.Variable(0, dtype=tf.int64))
  controller = _fake_controller(fake, steps_per_loop=3, summary_interval=3,
                                train_actions=[recorded.append])
  cwd = os.getcwd()
  os.chdir(tmp_path)
  try:
    controller.train(7)
  finally:
    os.chdir(cwd)
  assert fake.loops == [3, 3, 1]
  assert os.listdir(tmp_path) == []
  # A runner without output (a `TaskTrainer`): the loop's loss, and no
  # learning rate for a constant one.
  assert recorded == [{"loss": 0.5}] * 3
  assert "warning" not in capsys.readouterr().out


@pytest.mark.parametrize("reports_step", [True, False])
def test_a_loop_that_miscounts_steps_warns_and_goes_on_from_its_step(
    capsys, reports_step):
  # The second loop (steps 2 to 4) advances the step by 1 only.
  loops = itertools.count()
  fake = _FakeLoop(tf.Variable(0, dtype=tf.int64),
                   advance=lambda num_steps: 1 if next(loops) == 1 else
                   num_steps, reports_step=reports_step)
  controller = _fake_controller(fake, steps_per_loop=2)
  controller.train(6)
  # The step reached, re-read (or as the status reports it): the loop
  # after it makes up the missing step at the next multiple of 2.
  assert fake.loops == [2, 2, 1, 2]
  assert controller.step == 6 and int(fake.step.numpy()) == 6
  warnings = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith("warning")]
  assert warnings == [
      "warning | a training loop of 2 step(s) from step 2 reached step 3, "
      "not 4: the runner's `train` must add 1 to the global step per step; "
      "going on from step 3"]


def _saved_steps(model_dir):
  state = tf.train.get_checkpoint_state(str(model_dir))
  if state is None:
    return []
  return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


@pytest.mark.parametrize("manager_interval, options_interval, saved", [
    (4, None, [4, 8, 10]),  # The manager's, as Orbit.
    (None, None, []),  # Orbit: no interval, no saves, not even at the end.
    (None, 6, [6, 10]),  # Ours, given (the framework's `trainer.` one).
    (4, 6, [6, 10]),  # Ours wins.
])
def test_own_loop_saves_at_the_managers_interval_unless_given_one(
    tmp_path, manager_interval, options_interval, saved):
  assert controller_lib.ControllerOptions().checkpoint_interval is None
  fake = _FakeLoop(tf.Variable(0, dtype=tf.int64))
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(step=fake.step), str(tmp_path), max_to_keep=None,
      step_counter=fake.step, checkpoint_interval=manager_interval)
  controller = _fake_controller(
      fake, manager=manager, steps_per_loop=2,
      options=controller_lib.ControllerOptions(
          checkpoint_interval=options_interval))
  controller.train(10)
  assert fake.loops == [2] * 5
  assert _saved_steps(tmp_path) == saved


def test_the_run_puts_its_settings_back_after_every_restore(tmp_path):
  # The constructor's restore and a later one (a rollback's): each is
  # followed by `restored_fn`; initialising from nothing is not.
  step = tf.Variable(0, dtype=tf.int64)
  rate = tf.Variable(0.001)
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(step=step, rate=rate), str(tmp_path),
      max_to_keep=5)
  calls = []
  controller_lib.Controller(
      trainer=_WaitingTrainer(), global_step=step,
      strategy=tf.distribute.get_strategy(), checkpoint_manager=manager,
      steps_per_loop=1, restored_fn=lambda: calls.append(float(rate.numpy())))
  assert calls == []
  step.assign(3)
  manager.save(checkpoint_number=3)
  rate.assign(1e-12)
  controller = controller_lib.Controller(
      trainer=_WaitingTrainer(), global_step=step,
      strategy=tf.distribute.get_strategy(), checkpoint_manager=manager,
      steps_per_loop=1, restored_fn=lambda: calls.append(float(rate.numpy())))
  controller.restore_checkpoint()
  # Called once the checkpoint's value is in place.
  assert calls == [pytest.approx(0.001)] * 2
