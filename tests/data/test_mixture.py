"""Training mixtures: rates checked, sources mixed at their rates, each
example's source carried with it, the position resumed exactly."""

import math
import os

import numpy as np
import pytest
import tensorflow as tf

from trainer import errors
from trainer.data import inputs
from trainer.data import mixture


def _sources(clean=1000, noisy=1000):
  """Two sources told apart by sign: clean examples >= 0, noisy < 0."""
  return {"clean": tf.data.Dataset.range(clean),
          "noisy": tf.data.Dataset.range(1, noisy + 1).map(lambda x: -x)}


def _input(rates, sources=None, batch=100, exhausted="repeat", seed=0,
           batch_fn=None):
  sources = sources or _sources()
  return inputs.DistributedInput(
      tf.distribute.get_strategy(), lambda context: sources, batch,
      training=True, batch_fn=batch_fn,
      mixture=mixture.Mixture(rates, exhausted=exhausted, seed=seed),
      task_name="Mixed")


def test_a_70_30_mixture_gives_each_source_its_share_of_10000_examples():
  data = _input({"clean": 0.7, "noisy": 0.3})
  examples, sources = [], []
  for batch, index in data.dataset.take(100):  # 100 batches of 100.
    examples.append(batch.numpy())
    sources.append(index.numpy())
  examples, sources = np.concatenate(examples), np.concatenate(sources)
  assert examples.shape == (10000,)
  # The index carried is the example's source (clean >= 0, noisy < 0).
  np.testing.assert_array_equal(sources, (examples < 0).astype(np.int32))
  for index, rate in enumerate([0.7, 0.3]):
    share = float(np.mean(sources == index))
    sigma = math.sqrt(rate * (1 - rate) / 10000)
    assert abs(share - rate) < 4 * sigma, (index, share)
  # Each source is read in its own order, repeated when it runs out.
  assert list(examples[examples >= 0][:5]) == [0, 1, 2, 3, 4]
  assert len(set(examples[examples >= 0])) == 1000


def test_the_task_sees_its_own_batch_and_the_summaries_the_sources():
  data = _input({"clean": 1, "noisy": 3})
  assert data.element_spec == tf.TensorSpec([100], tf.int64)
  batch, index = data.sources(next(iter(data.dataset)))
  assert batch.shape == (100,) and index.dtype == tf.int32
  plain = inputs.DistributedInput(tf.distribute.get_strategy(),
                                  lambda context: tf.data.Dataset.range(10),
                                  5, training=True)
  assert plain.mixture is None and plain.sources("batch") == ("batch", None)
  assert mixture.Mixture({"clean": 1, "noisy": 3}).shares == {
      "clean": 0.25, "noisy": 0.75}


def test_preprocess_batch_gets_the_task_s_part_only():
  data = _input({"clean": 1.0, "noisy": 1.0},
                batch_fn=lambda batch, seed: batch * 10)
  batch, index = next(iter(data.dataset))
  np.testing.assert_array_equal(batch.numpy() % 10, 0)
  assert index.shape == (100,)


def test_the_same_seed_draws_the_same_sequence_another_seed_another():
  def first(seed):
    return next(iter(_input({"clean": 0.5, "noisy": 0.5},
                            seed=seed).dataset))[1].numpy()
  np.testing.assert_array_equal(first(1), first(1))
  assert (first(1) != first(2)).any()


def test_a_checkpointed_iterator_resumes_the_sampling_position(tmp_path):
  data = _input({"clean": 0.7, "noisy": 0.3})
  iterator = iter(data.dataset)
  for _ in range(7):
    next(iterator)
  checkpoint = tf.train.Checkpoint(iterator=iterator)
  path = checkpoint.save(str(tmp_path / "ckpt"))
  expected = [next(iterator)[0].numpy() for _ in range(5)]
  restored = iter(_input({"clean": 0.7, "noisy": 0.3}).dataset)
  tf.train.Checkpoint(iterator=restored).restore(path)
  for want in expected:
    np.testing.assert_array_equal(next(restored)[0].numpy(), want)
  assert inputs.is_checkpointable(data.dataset)


def test_a_rebuilt_mixture_skipped_by_n_batches_is_where_it_was():
  data = _input({"clean": 0.7, "noisy": 0.3})
  straight = [b.numpy() for b, _ in data.dataset.take(12)]
  skipped = [b.numpy() for b, _ in data.build().skip(7).take(5)]
  for want, got in zip(straight[7:], skipped):
    np.testing.assert_array_equal(got, want)


def test_end_stops_the_mixture_s_epoch_at_the_first_source_run_out():
  sources = _sources(clean=1000, noisy=20)
  mixed = mixture.Mixture({"clean": 0.5, "noisy": 0.5}, exhausted="end").mix(
      sources, "Mixed")
  examples = np.array([x.numpy() for x, _ in mixed])
  # Ends when the 21st noisy example is drawn: every noisy one was seen,
  # the last example drawn is noisy, and some clean ones came between.
  assert (examples < 0).sum() == 20 and examples[-1] == -20
  assert 0 < (examples >= 0).sum() < 100
  # Repeated by the framework, the next epoch draws anew.
  data = _input({"clean": 0.5, "noisy": 0.5}, sources=sources, batch=10,
                exhausted="end")
  assert data.dataset.take(20).reduce(0, lambda n, _: n + 1).numpy() == 20


@pytest.mark.parametrize("policy", ["DYNAMIC", "OFF"])
def test_a_mixture_read_through_the_tf_data_service_keeps_its_sources(policy):
  service = tf.data.experimental.service
  dispatcher = service.DispatchServer()
  worker = service.WorkerServer(service.WorkerConfig(
      dispatcher_address=dispatcher.target.split("://")[1]))
  mixed = mixture.Mixture({"clean": 0.7, "noisy": 0.3}).mix(
      _sources(), "Mixed").batch(100)
  remote = mixed.apply(service.distribute(
      processing_mode=getattr(service.ShardingPolicy, policy),
      service=dispatcher.target))
  examples, sources = zip(*[(b.numpy(), i.numpy()) for b, i in
                            remote.take(20)])
  examples, sources = np.concatenate(examples), np.concatenate(sources)
  np.testing.assert_array_equal(sources, (examples < 0).astype(np.int32))
  # 2,000 examples: 4 sigma of 0.3 is 0.041.
  assert abs(np.mean(sources) - 0.3) < 0.041
  del worker


def test_a_zero_rate_leaves_a_source_out():
  data = _input({"clean": 0.0, "noisy": 1.0})
  _, index = next(iter(data.dataset))
  np.testing.assert_array_equal(index.numpy(), 1)


@pytest.mark.parametrize("rates,message", [
    ({"clean": -0.3, "noisy": 1.0},
     "`trainer.mixture` gives 'clean' the rate -0.3: a rate must be a number "
     ">= 0 (0 leaves the source out)."),
    ({"clean": 0, "noisy": 0.0},
     "`trainer.mixture` rates sum to 0: give at least one source a positive "
     "rate."),
    ({"clean": "a lot"},
     "`trainer.mixture` gives 'clean' the rate 'a lot': a rate must be a "
     "number >= 0 (0 leaves the source out)."),
    ({"clean": float("nan")},
     "`trainer.mixture` gives 'clean' the rate nan: a rate must be a number "
     ">= 0 (0 leaves the source out)."),
    ({}, "`trainer.mixture` ({}) must map each training source's name to its "
     'rate, e.g. {"clean": 0.7, "noisy": 0.3}.'),
    ({"a b": 1.0},
     "`trainer.mixture` names a source 'a b': a source's name must be "
     "letters, digits, `_`, `.` or `-` (it becomes the summary tag "
     "`mixture/<name>`)."),
])
def test_bad_rates_are_one_line(rates, message):
  with pytest.raises(errors.ConfigError) as raised:
    mixture.check_rates(rates)
  assert str(raised.value) == message


@pytest.mark.parametrize("rates,sources,message", [
    ({"clean": 0.7, "noisy": 0.2, "extra": 0.1}, _sources,
     "`trainer.mixture` gives a rate to 'extra', which "
     "Mixed.build_inputs(training=True) does not return (it returns: clean, "
     "noisy)."),
    ({"clean": 1.0}, _sources,
     "Mixed.build_inputs(training=True) returns 'noisy', which has no rate in "
     "`trainer.mixture` (it gives: clean); give every source a rate (0 leaves "
     "one out)."),
    ({"clean": 1.0}, lambda: tf.data.Dataset.range(3),
     "`trainer.mixture` gives rates (clean), but "
     "Mixed.build_inputs(training=True) returns one _RangeDataset, not a dict "
     "of datasets by name."),
    ({"clean": 1.0, "noisy": 1.0},
     lambda: {"clean": tf.data.Dataset.range(3),
              "noisy": tf.data.Dataset.range(3).map(
                  lambda x: tf.cast(x, tf.float32))},
     "Mixed.build_inputs(training=True): the examples of 'noisy' "
     "(TensorSpec(shape=(), dtype=tf.float32, name=None)) differ from those "
     "of 'clean' (TensorSpec(shape=(), dtype=tf.int64, name=None)); every "
     "source must give examples of one structure and dtype."),
    ({"clean": 1.0, "noisy": 1.0},
     lambda: {"clean": tf.data.Dataset.range(3),
              "noisy": tf.data.Dataset.range(0)},
     "the training source 'noisy' is empty (its rate is 1)."),
])
def test_sources_that_do_not_fit_the_rates_are_one_line(rates, sources,
                                                        message):
  with pytest.raises(errors.ConfigError) as raised:
    _input(rates, sources=sources())
  assert str(raised.value) == message


def test_several_datasets_without_rates_are_one_line():
  with pytest.raises(errors.ConfigError) as raised:
    inputs.DistributedInput(tf.distribute.get_strategy(),
                            lambda context: _sources(), 10, training=True,
                            task_name="Mixed")
  assert str(raised.value) == (
      "Mixed.build_inputs(training=True) returns several datasets (clean, "
      "noisy) but no rates: give them in `trainer.mixture` (e.g. "
      '`trainer.mixture = {"name": 0.5, ...}`) or `Mixed.mixture_rates`.')


class _Task:
  def __init__(self, rates=None):
    self.rates = rates

  def mixture_rates(self):
    return self.rates


class _Config:
  def __init__(self, rates=None, exhausted="repeat"):
    self.mixture, self.mixture_exhausted = rates, exhausted
    self.mixture_schedule = None


class _Runtime:
  seed = 7


def test_trainer_mixture_wins_over_the_task_s_rates():
  assert mixture.for_task(_Task(), _Config(), _Runtime()) is None
  from_task = mixture.for_task(_Task({"a": 1.0}), _Config(), _Runtime())
  assert (from_task.rates, from_task.where, from_task.seed) == (
      {"a": 1.0}, "_Task.mixture_rates", 7)
  configured = mixture.for_task(_Task({"a": 1.0}), _Config({"b": 2}),
                                _Runtime())
  assert (configured.rates, configured.where) == ({"b": 2.0},
                                                  "trainer.mixture")
  assert configured.describe() == (
      "b 1 (from `trainer.mixture`; a source that runs out starts "
      "over)")
  with pytest.raises(errors.ConfigError,
                     match=r"^`_Task.mixture_rates` rates sum to 0"):
    mixture.for_task(_Task({"a": 0}), _Config(), _Runtime())


# Whole runs, in this process: the shares in the summaries, several
# replicas and micro-batches.

def _run(model_dir, rates=None, task_rates=None, task=None, **settings):
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer import experiment  # pylint: disable=g-import-not-at-top
  import helpers  # pylint: disable=g-import-not-at-top
  strategy = settings.pop("strategy", "one_device")
  config = dict(train_steps=20, steps_per_loop=10, summary_interval=10,
                global_batch_size=32, mixture=rates)
  config.update(settings)
  experiment.run(
      task or helpers.MixedRegression(rates=task_rates), "train",
      str(model_dir),
      trainer.RuntimeConfig(distribution_strategy=strategy, seed=0,
                            num_cpu_devices=2 if strategy == "mirrored" else 0),
      trainer.TrainerConfig(**config))
  return helpers.checkpoint_weights(str(model_dir)), helpers.read_scalars(
      str(model_dir / "train"))


def test_a_run_summarises_each_source_s_share_and_keeps_the_task_s_rates(
    tmp_path):
  _, scalars = _run(tmp_path / "run", rates={"clean": 0.7, "shifted": 0.3},
                    train_steps=40)
  clean = [share for _, share in scalars["mixture/clean"]]
  shifted = [share for _, share in scalars["mixture/shifted"]]
  assert [step for step, _ in scalars["mixture/clean"]] == [10, 20, 30, 40]
  np.testing.assert_allclose(np.add(clean, shifted), 1.0, rtol=1e-6)
  # 320 examples a window: 4 sigma of 0.7 is 0.1.
  assert all(abs(share - 0.7) < 0.1 for share in clean), clean
  # The Task's hook gives the rates where `trainer.mixture` does not.
  _, scalars = _run(tmp_path / "hook", task_rates={"clean": 0.0,
                                                   "shifted": 1.0})
  assert [share for _, share in scalars["mixture/shifted"]] == [1.0, 1.0]


def test_a_mixture_on_two_replicas_with_micro_batches_trains_as_on_one(
    tmp_path):
  import helpers  # pylint: disable=g-import-not-at-top
  rates = {"clean": 0.7, "shifted": 0.3}
  one, _ = _run(tmp_path / "one", rates)
  two, scalars = _run(tmp_path / "two", rates, strategy="mirrored",
                      gradient_accumulation_steps=2)
  # The same batches, split over replicas and micro-batches: SGD's update
  # is the same to float rounding.
  assert helpers.max_weight_difference(one, two) < 1e-5
  assert len(scalars["mixture/clean"]) == 2


def test_a_run_on_two_replicas_summarises_each_source_s_mean_loss(tmp_path):
  # Zero weights that do not move: each example's loss is its target
  # squared, so each window's mean per source is computed here by hand from
  # the same mixture's batches (2 windows of 10 steps of 32 examples).
  import helpers  # pylint: disable=g-import-not-at-top
  task = helpers.ZeroMixedRegression()
  _, scalars = _run(tmp_path / "run", task=task, strategy="mirrored",
                    gradient_accumulation_steps=2)
  expected = helpers.source_losses(inputs.DistributedInput(
      tf.distribute.get_strategy(),
      lambda context: task.build_inputs(True, context), 32, training=True,
      mixture=mixture.Mixture(task.rates, seed=0)).dataset, [10, 10])
  for name in ("clean", "shifted"):
    steps, losses = zip(*scalars[f"mixture/{name}/loss"])
    assert steps == (10, 20)
    np.testing.assert_allclose(losses, [window[name] for window in expected],
                               rtol=1e-6)


# Real train.py processes: a SIGKILL resume, the input positions, bad input.

_TASK_MODULE = '''
import gin
import helpers
gin.external_configurable(helpers.MixedRegression, "MixedRegression")
'''

_GIN = '''
import mixed_task
experiment.task = @MixedRegression()
trainer.mixture = {"clean": 0.7, "shifted": 0.3}
trainer.global_batch_size = 32
trainer.steps_per_loop = 10
trainer.summary_interval = 10
trainer.checkpoint_interval = 20
runtime.deterministic = True
'''


@pytest.fixture
def mixed_cli(tmp_path):
  """A folder with the mixed task's module and gin file; returns a function
  that starts `train.py` there with `args`."""
  import helpers  # pylint: disable=g-import-not-at-top
  (tmp_path / "mixed_task.py").write_text(_TASK_MODULE)
  (tmp_path / "mixed.gin").write_text(_GIN)
  tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {"PYTHONPATH": tests_dir}

  def start(model_dir, steps, *params):
    return helpers.TrainProcess(
        ["--gin_file=mixed.gin", "--mode=train", f"--model_dir={model_dir}",
         f"--gin_param=trainer.train_steps={steps}",
         *[f"--gin_param={param}" for param in params]],
        env=env, cwd=str(tmp_path))

  return start


def _mixed_regression_input(global_seed=None):
  """The training input of `_GIN`'s run, built under `global_seed` (the
  run's `runtime.deterministic` makes it 0)."""
  import helpers  # pylint: disable=g-import-not-at-top
  tf.random.set_seed(global_seed)
  try:
    task = helpers.MixedRegression()
    return inputs.DistributedInput(
        tf.distribute.get_strategy(),
        lambda context: task.build_inputs(True, context), 32, training=True,
        mixture=mixture.Mixture({"clean": 0.7, "shifted": 0.3}, seed=0))
  finally:
    tf.random.set_seed(None)


def _next_batches(model_dir, count=10):
  """The next `count` batches of the mixture whose iterator the newest
  checkpoint in `model_dir` holds, as the run built it: under its global
  seed, which seeds the sources' epochs not begun at the save."""
  from trainer.storage import checkpoints  # pylint: disable=g-import-not-at-top
  iterator = iter(_mixed_regression_input(global_seed=0).dataset)
  tf.train.Checkpoint(**{checkpoints.INPUT_POSITION: iterator}).restore(
      tf.train.latest_checkpoint(
          str(model_dir))).assert_existing_objects_matched().expect_partial()
  return [tf.nest.map_structure(lambda t: t.numpy(), next(iterator))
          for _ in range(count)]


def test_a_restored_position_reads_on_as_saved_only_under_the_run_s_seed(
    tmp_path):
  # A reshuffling source's epoch in progress is in the checkpoint; the
  # later ones are drawn from the seeds of the pipeline restoring it. Two
  # runs saved at one step with their prefetch at different depths hold
  # different epochs in progress, so restored under another global seed
  # than theirs they part at an epoch boundary (the killed-and-resumed
  # test compared its runs so: 1 failure in 8).
  iterator = iter(_mixed_regression_input(global_seed=0).dataset)
  for _ in range(10):
    next(iterator)
  path = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
  live = np.concatenate([next(iterator)[0][0].numpy() for _ in range(40)])

  def restored(global_seed):
    again = iter(_mixed_regression_input(global_seed).dataset)
    tf.train.Checkpoint(iterator=again).restore(path)
    return np.concatenate([next(again)[0][0].numpy() for _ in range(40)])

  np.testing.assert_array_equal(restored(0), live)
  parted = np.nonzero((restored(None) != live).any(axis=1))[0]
  # 40 batches of 32: some 900 clean examples, 4 epochs of 192 ahead.
  assert 0 < parted[0] < 1280, parted[:3]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_a_mixture_killed_and_resumed_ends_as_one_never_interrupted(
    mixed_cli, tmp_path, seed):
  import helpers  # pylint: disable=g-import-not-at-top
  killed_dir, straight_dir = tmp_path / "killed", tmp_path / "straight"
  saved = helpers.kill_after_first_save(
      mixed_cli(killed_dir, 100000), str(killed_dir), seed, spread=1.0)
  final = saved + 40
  resumed = mixed_cli(killed_dir, final)
  assert resumed.finish() == 0, resumed.stderr[-2000:]
  assert f"restored checkpoint {killed_dir}/ckpt-{saved}" in resumed.output
  straight = mixed_cli(straight_dir, final)
  assert straight.finish() == 0, straight.stderr[-2000:]
  helpers.assert_same_numbers(str(killed_dir), str(straight_dir))
  # The sampling position too: the next batches, sources included.
  for got, want in zip(_next_batches(killed_dir),
                       _next_batches(straight_dir)):
    tf.nest.map_structure(np.testing.assert_array_equal, got, want)


@pytest.mark.slow
def test_skip_and_restart_find_their_place_in_a_mixture(mixed_cli, tmp_path):
  import helpers  # pylint: disable=g-import-not-at-top
  straight = mixed_cli(tmp_path / "straight", 60)
  assert straight.finish() == 0, straight.stderr[-2000:]
  reference = helpers.checkpoint_weights(str(tmp_path / "straight"))
  for position in ("skip", "restart"):
    model_dir = tmp_path / position
    param = f'trainer.input_position="{position}"'
    first = mixed_cli(model_dir, 20, param)
    assert first.finish() == 0, first.stderr[-2000:]
    resumed = mixed_cli(model_dir, 60, param)
    assert resumed.finish() == 0, resumed.stderr[-2000:]
    difference = helpers.max_weight_difference(
        helpers.checkpoint_weights(str(model_dir)), reference)
    if position == "skip":  # 20 batches read again and thrown away: exact.
      assert difference == 0.0
    else:  # The mixture started over at step 20: other batches.
      assert difference > 1e-4


@pytest.mark.slow
def test_rates_changed_at_a_resume_hold_from_the_resumed_step(mixed_cli,
                                                              tmp_path):
  import helpers  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / "run"
  first = mixed_cli(model_dir, 20)
  assert first.finish() == 0, first.stderr[-2000:]
  resumed = mixed_cli(model_dir, 40,
                      'trainer.mixture={"clean": 1.0, "shifted": 0.0}')
  assert resumed.finish() == 0, resumed.stderr[-2000:]
  # No shifted example in steps 21-40: the checkpoint's prefetched batches
  # and drawn block (0.3 shifted) were trained on for ~48 steps before.
  shares = helpers.read_scalars(str(model_dir / "train"))["mixture/shifted"]
  assert [(step, share) for step, share in shares if step > 20] == [
      (30, 0.0), (40, 0.0)]
  assert all(share > 0.1 for step, share in shares if step <= 20), shares
  assert ("input | resuming with the mixture changed (trainer.mixture): the "
          "new rates hold from step 21; skips the 20 batch(es) trained on "
          "before in a mixture rebuilt at them, in place of the "
          "checkpoint's, whose buffered draws are at the old rates"
          in resumed.output.splitlines()), resumed.output[-2000:]


_BAD = [
    ("a rate for a source not returned",
     ['trainer.mixture={"clean": 0.7, "shifted": 0.2, "extra": 0.1}'],
     "`trainer.mixture` gives a rate to 'extra', which "
     "MixedRegression.build_inputs(training=True) does not return (it "
     "returns: clean, shifted)."),
    ("a source without a rate", ['trainer.mixture={"clean": 1.0}'],
     "MixedRegression.build_inputs(training=True) returns 'shifted', which "
     "has no rate in `trainer.mixture` (it gives: clean); give every source "
     "a rate (0 leaves one out)."),
    ("a negative rate", ['trainer.mixture={"clean": 1.0, "shifted": -1.0}'],
     "`trainer.mixture` gives 'shifted' the rate -1.0: a rate must be a "
     "number >= 0 (0 leaves the source out)."),
    ("rates summing to 0", ['trainer.mixture={"clean": 0, "shifted": 0}'],
     "`trainer.mixture` rates sum to 0: give at least one source a positive "
     "rate."),
    ("no rates", ["trainer.mixture=None"],
     "MixedRegression.build_inputs(training=True) returns several datasets "
     "(clean, shifted) but no rates: give them in `trainer.mixture` (e.g. "
     '`trainer.mixture = {"name": 0.5, ...}`) or '
     "`MixedRegression.mixture_rates`."),
    ("an unknown exhaustion", ['trainer.mixture_exhausted="stop"'],
     "`trainer.mixture_exhausted`"),
]


@pytest.mark.parametrize(
    "name,params,message",
    [pytest.param(*row, marks=() if row[0] == "a source without a rate"
                  else pytest.mark.slow) for row in _BAD],
    ids=[row[0] for row in _BAD])
def test_bad_mixture_input_is_one_line_exit_2_and_writes_nothing(
    mixed_cli, tmp_path, name, params, message):
  del name  # The test id.
  model_dir = tmp_path / "run"
  finished = mixed_cli(model_dir, 20, *params)
  assert finished.finish() == 2, finished.stderr[-2000:]
  lines = finished.stderr.strip().splitlines()
  assert lines[-1].startswith("train.py: error: "), lines[-3:]
  assert message in lines[-1]
  assert not model_dir.exists() or not os.listdir(model_dir)


def test_a_schedule_moves_the_shares_linearly_between_its_steps():
  # A step reads 1,024 examples: one block of draws a step.
  scheduled = mixture.Mixture(
      {"clean": 1.0, "noisy": 0.0}, examples_per_step=1024,
      schedule={0: {"clean": 1.0, "noisy": 0.0},
                10: {"clean": 1.0, "noisy": 0.0},
                30: {"clean": 0.0, "noisy": 2.0}})
  _, sources = zip(*scheduled.mix(_sources(), "Mixed").batch(1024).take(40))
  noisy = [float(np.mean(step.numpy())) for step in sources]
  assert noisy[:11] == [0.0] * 11 and noisy[30:] == [1.0] * 10
  # Half way, at step 20: 0.5 (4 sigma of 1,024 draws: 0.0625).
  assert abs(noisy[20] - 0.5) < 0.0625
  assert noisy[15] < noisy[20] < noisy[25]
  assert scheduled.describe() == (
      "clean 1 -> 1 -> 0, noisy 0 -> 0 -> 1 at steps 0, 10, 30 "
      "(from `trainer.mixture_schedule`; a source that runs out starts over)")


@pytest.mark.parametrize("schedule,message", [
    ({5: {"a": 1.0}},
     "`trainer.mixture_schedule` must give the rates at step 0 (it starts "
     "at step 5)."),
    ({0: {"a": 1.0}, -1: {"a": 1.0}},
     "`trainer.mixture_schedule` has the step -1: steps must be integers "
     ">= 0."),
    ({0: {"a": 1.0, "b": 0.0}, 10: {"a": 1.0}},
     "`trainer.mixture_schedule[10]` names a; step 0 names a, b: every step "
     "gives every source a rate."),
    ({0: {"a": 0.0}},
     "`trainer.mixture_schedule[0]` rates sum to 0: give at least one source "
     "a positive rate."),
])
def test_bad_schedules_are_one_line(schedule, message):
  with pytest.raises(errors.ConfigError) as raised:
    mixture.check_schedule(schedule)
  assert str(raised.value) == message


def test_a_schedule_is_checked_with_the_configuration():
  import trainer  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.ConfigError) as raised:
    trainer.TrainerConfig(mixture={"a": 1.0},
                          mixture_schedule={0: {"a": 1.0}})
  # (gin adds the configurable's name on a line of its own.)
  assert str(raised.value).splitlines()[0] == (
      "give `trainer.mixture` or `trainer.mixture_schedule`, not both.")
  with pytest.raises(errors.ConfigError) as raised:
    trainer.TrainerConfig(mixture={"a": -1})
  assert str(raised.value).startswith("`trainer.mixture` gives 'a' the rate")
  with pytest.raises(errors.ConfigError) as raised:
    mixture.Mixture({"a": 1.0}, exhausted="end", schedule={0: {"a": 1.0}})
  assert str(raised.value) == (
      '`trainer.mixture_schedule` needs `trainer.mixture_exhausted = '
      '"repeat"`: with "end" every epoch of the mixture would start its '
      'schedule over.')
