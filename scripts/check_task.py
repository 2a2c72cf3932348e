"""Checks a Task: hook shapes, replica invariance and exact resume.

For a task's gin configuration (the files and bindings `train.py` takes), in
one process, through the framework's own input, trainer and step (the
Task's `train_step` override included), it checks that:

  build_inputs  returns single examples, not batches;
  build_losses  returns per-example losses, shape [batch];
  input         two builds of the training input give the same first batch;
  replicas      `--steps` steps on one device and on `--replicas` logical
                CPU replicas, at the same global batch and from the same
                weights, report the same losses and end with the same
                weights;
  resume        half the steps, a checkpoint (model, optimizer, step, input
                position), a restore into a fresh model and optimizer, and
                the other half end where the uninterrupted steps did (a
                mixture's sampling position included);
  eval          each evaluation set (every named one, or the one unnamed),
                evaluated whole (a set of a size tf.data does not know,
                which may never end, for `trainer.validation_steps`
                batches where they are counted) with the same weights on
                one device and on replicas, gives the same results.

Every run uses plain SGD (`--learning_rate`) in float32, whatever the task's
optimizer and precision: Adam would hide a wrong loss scale. A pipelined
model (`pipeline.*`) is checked whole: a pipeline cannot run on replicas,
and the pipeline itself is not checked (a `SKIP pipeline` line says so). A
failed check names the likely cause: the loss averaged over the per-replica
batch, `BatchNormalization` without `synchronized=True`, stateful random ops
in the step, or input that differs between builds.

Usage:
  python scripts/check_task.py --gin_file=my.gin [--gin_param=...]
      [--replicas=2] [--steps=6]

Exit code 0 when every check passes, 1 when one fails, 2 for a
configuration error.
"""

import dataclasses
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))  # local-path: this repository
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402  Selects Keras 2 before TensorFlow loads.
from absl import flags
import numpy as np
import tensorflow as tf
import tf_keras

from trainer import actions
from trainer import build
from trainer import cli
from trainer import console
from trainer import errors
from trainer import state as state_lib
from trainer.data import eval_sets
from trainer.data import input_state
from trainer.data import inputs as inputs_lib
from trainer.distribute import pipeline
from trainer.loop.runner import evaluator as evaluator_lib
from trainer.loop.runner import runners
from trainer.model import named
from trainer.model import task as task_lib

PROGRAM = "check_task.py"
FLAGS = flags.FLAGS
flags.DEFINE_integer("replicas", 2, "Logical CPU replicas compared with one "
                     "device.", lower_bound=2)
flags.DEFINE_integer("steps", 6, "Training steps per run; the resume check "
                     "saves after half of them.", lower_bound=2)
flags.DEFINE_float("learning_rate", 0.05, "Learning rate of the plain SGD "
                   "every run uses.", lower_bound=0.0)
flags.DEFINE_integer("seed", 0, "Seeds every run.")

# Runs of a correct task differ only in float32 summation order: 1.8e-7
# measured (max weight difference, 50 SGD steps, 1 vs 2 replicas); here,
# with the defaults, 1.5e-8 (digits) to 1.2e-7, while the per-replica
# averaging bug gave 0.1, plain BatchNormalization 0.022 and Dropout 0.1.
# 1e-4, relative to the largest weight (or loss) when above 1, sits ~500x
# above rounding and over 100x below what the bugs do in a few steps.
TOLERANCE = 1e-4
DIFFERENT_INPUT_CAUSE = "the runs read different batches (see input)"
AVERAGING_CAUSE = ("the train_step averages the loss over the per-replica "
                   "batch; divide by the global batch: "
                   "tf.nn.compute_average_loss")


@dataclasses.dataclass
class Run:
  """One training run of the check, built as `train.py` builds one."""
  train_input: inputs_lib.DistributedInput
  state: state_lib.TrainState
  trainer: runners.TaskTrainer
  first_batch: Any

  @property
  def model(self):
    """The model, or the models by name."""
    return self.state.model

  def train(self, num_steps: int) -> List[float]:
    """Trains `num_steps` steps one at a time; returns each step's loss.

    Raises:
      errors.ConfigError: If a loss is not finite (SGD diverged).
    """
    one = tf.constant(1, tf.int32)  # One trace for every call.
    losses = []
    for _ in range(num_steps):
      self.trainer.train(one)
      status = self.trainer.loop_status()
      if status.nonfinite_step >= 0:
        raise errors.ConfigError(
            f"the loss is not finite at step {status.nonfinite_step} with "
            f"SGD at --learning_rate={FLAGS.learning_rate:g}: lower it.")
      losses.append(status.loss)
    return losses

  def checkpoint(self, with_input: bool) -> tf.train.Checkpoint:
    """What `train.py` checkpoints, the input position if `with_input`."""
    return tf.train.Checkpoint(**build.checkpoint_items(
        self.state, self.trainer, with_input=with_input))


def build_run(task: task_lib.Task, setup: build.Process,
              config: trainer.TrainerConfig,
              runtime: trainer.RuntimeConfig,
              weights: Optional[List[np.ndarray]] = None) -> Run:
  """Builds the input, model, SGD optimizer and trainer of one run in the
  strategy of `setup`, with the input settings of `runtime`.

  Every run seeds the same way before the same calls, so tasks that shuffle
  without a seed of their own still read the same batches in every run.
  """
  tf_keras.utils.set_random_seed(FLAGS.seed)
  train_input = inputs_lib.for_task(task, True, setup.strategy, config,
                                    runtime)
  # A new dataset: a second iterator over `train_input.dataset` would
  # reshuffle the trainer's (`shuffle(reshuffle_each_iteration=True)`).
  first_batch = next(iter(train_input.build()))
  state = build.state(  # One SGD per trained model.
      task, setup, train_input.element_spec, config, training=True,
      optimizer_fn=lambda: tf_keras.optimizers.SGD(FLAGS.learning_rate))
  if weights is None:
    task.initialize(state.model, config.warm_start)
  else:
    set_weights(state.model, weights)
  # The replicas check names a loss averaged per replica itself, with its
  # figures, rather than stopping at the first step as a run does.
  task_trainer = build.trainer(
      task, state, train_input,
      dataclasses.replace(config, check_loss_scaling=False), setup.runtime)
  return Run(train_input, state, task_trainer, first_batch)


def get_weights(model) -> List[np.ndarray]:
  """The weights of the model, or of every model in name order."""
  return [w.numpy() for w in named.weights(model)]


def set_weights(model, weights: List[np.ndarray]) -> None:
  """Sets what `get_weights` returned."""
  for variable, value in zip(named.weights(model), weights):
    variable.assign(value)


def model_differences(one, many) -> Dict[str, float]:
  """With several models: each model's max weight difference, by name."""
  return {name: max_difference([w.numpy() for w in model.weights],
                               [w.numpy() for w in many[name].weights])
          for name, model in named.named(one).items()}


def max_difference(a: Sequence[Any], b: Sequence[Any]) -> float:
  """The largest absolute difference of paired arrays; inf where arrays
  that cannot be subtracted (strings, other shapes) differ."""
  largest = 0.0
  for x, y in zip(a, b):
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or not np.issubdtype(x.dtype, np.number):
      largest = max(largest, 0.0 if np.array_equal(x, y) else float("inf"))
    else:
      largest = max(largest, float(np.max(np.abs(x - y), initial=0.0)))
  return largest


def scale(values: Sequence[np.ndarray]) -> float:
  """The tolerance's scale: the largest magnitude, at least 1."""
  return max([1.0] + [float(np.max(np.abs(v), initial=0.0)) for v in values])


def describe_specs(spec) -> str:
  return ", ".join(f"{tuple(s.shape)} {s.dtype.name}"
                   for s in tf.nest.flatten(spec))


class HookFailed(Exception):
  """A Task hook raised or returned what the framework cannot use."""

  def __init__(self, hook: str, problem: str):
    super().__init__(f"{hook}: {problem}")
    self.hook = hook
    self.problem = problem


def call_hook(hook: str, fn, *args, **kwargs):
  """Calls one of the task's hooks; an error becomes `HookFailed`."""
  try:
    return fn(*args, **kwargs)
  except NotImplementedError:
    raise
  except errors.ConfigError as e:  # The framework's own check of the hook.
    raise HookFailed(hook, str(e)) from e
  except Exception as e:  # The user's code: anything may come out.
    first_line = (str(e).strip().splitlines() or [""])[0]
    raise HookFailed(hook, f"raises {type(e).__name__}: {first_line}") from e


def check_hooks(task: task_lib.Task, strategy: tf.distribute.Strategy,
                config: trainer.TrainerConfig,
                runtime: trainer.RuntimeConfig) -> None:
  """Checks what `build_inputs` and `build_losses` return, printing a line
  for each.

  Raises:
    HookFailed: For the first hook that fails.
  """
  examples = call_hook("build_inputs", task.build_inputs, True,
                       tf.distribute.InputContext())
  with strategy.scope():
    model = call_hook("build_model", task.build_model)
  call_hook("build_model", named.check_models, type(task).__name__, model)
  # The framework's own checks, as `train.py` runs them.
  train_input = call_hook("build_inputs", inputs_lib.for_task, task, True,
                          strategy, config, runtime)
  if not named.several(model) and model.built:
    call_hook("build_inputs", state_lib.check_input_ranks, model,
              train_input.element_spec[0])
  if train_input.mixture is None:
    report(True, "build_inputs",
           f"single examples ({describe_specs(examples.element_spec)})")
  else:
    # A mixture's sources, each of single examples; the resume check below
    # restores the sampling position with the sources'.
    report(True, "build_inputs", "a mixture of " + "; ".join(
        f"{name}: single examples ({describe_specs(source.element_spec)})"
        for name, source in examples.items()))
    report(True, "mixture", train_input.mixture.describe() +
           "; the input and resume checks below read it")
  # The losses of an eval batch, as `validation_step` returns them: training
  # batches may need the task's own step to become model inputs (CIFAR-10's
  # crops), eval batches go to the model as they are.
  # The first evaluation set stands for all here; each is checked on
  # replicas after training (`compare_eval_sets`).
  eval_inputs = call_hook("build_inputs", inputs_lib.for_eval_sets, task,
                          strategy, config, runtime)
  eval_input = next(iter(eval_inputs.values()))
  for name, each in named.named(model).items():
    call_hook("build_model", state_lib.ensure_built, each,
              eval_input.dataset.element_spec, name)
  batch = next(iter(eval_input.dataset))
  hook = ("validation_step" if task_lib.overrides(task, "validation_step")
          else "build_losses")
  # The eval metrics, as the evaluator passes them: a step may update them.
  with strategy.scope():
    metrics = call_hook("build_metrics", task.build_metrics, training=False)
  try:
    logs = call_hook(hook, task.validation_step, batch, model, metrics)
  except NotImplementedError:
    report(None, hook, "not defined")
    return
  size = int(tf.shape(tf.nest.flatten(batch)[0])[0])
  losses = logs.get("loss") if isinstance(logs, dict) else None
  shape = getattr(losses, "shape", None)
  if shape is None or shape.as_list() != [size]:
    raise HookFailed(
        hook, f"returns losses of shape {shape} for a batch of {size}; it "
        "must return per-example losses, shape [batch] (do not reduce over "
        "the batch: the step divides by the global batch)")
  report(True, hook, f"per-example losses, shape [{size}]")


def unsynchronized_batch_norms(model: tf_keras.Model) -> List[str]:
  """Names the trainable `BatchNormalization` layers that replicas run on
  their own slice of the batch."""
  return [layer.name for layer in model.submodules
          if isinstance(layer, tf_keras.layers.BatchNormalization)
          and layer.trainable and not layer.synchronized]


def random_ops_cause(random_ops: List[str]) -> str:
  listed = ", ".join(random_ops[:3]) + (", ..." if len(random_ops) > 3 else "")
  return (f"stateful random ops in the step ({listed}): use "
          "tf.random.stateless_* ops seeded from the step")


def report(passed: Optional[bool], check: str, text: str) -> None:
  """Prints `PASS|FAIL|SKIP check: text`."""
  word = {True: "PASS", False: "FAIL", None: "SKIP"}[passed]
  print(f"{word} {check}: {text}", flush=True)


def check(task: task_lib.Task, runtime: trainer.RuntimeConfig,
          config: trainer.TrainerConfig) -> bool:
  """Runs every check, printing a line each; returns whether all passed."""
  num_replicas, steps = FLAGS.replicas, FLAGS.steps
  inputs_lib.per_replica_batch_size(config.global_batch_size, num_replicas,
                                    "trainer.global_batch_size")
  # The mirrored strategy first: it splits the CPU, which must happen before
  # anything else initialises TensorFlow's devices.
  mirrored = build.process(trainer.RuntimeConfig(
      distribution_strategy="mirrored", num_cpu_devices=num_replicas))
  single = build.process(
      trainer.RuntimeConfig(distribution_strategy="one_device"))
  print(f"check_task | {type(task).__name__}: {steps} steps of SGD (learning "
        f"rate {FLAGS.learning_rate:g}), global batch "
        f"{config.global_batch_size}, 1 device vs {num_replicas} replicas",
        flush=True)
  if config.pipeline.enabled:
    # A pipeline runs one copy of the model over its stages' devices: it
    # cannot run on replicas, so the checks run the model whole instead.
    cut = ("cut at `pipeline.boundaries`" if config.pipeline.boundaries
           else "cut into `pipeline.task_stages`")
    report(None, "pipeline", "not checked; every check below runs the model "
           f"whole, not {cut} (a pipeline cannot run on replicas)")
    # Every field given: `pipeline.PipelineConfig()` would take the
    # pipeline's gin bindings again.
    unpipelined = dataclasses.replace(config.pipeline, **{
        field.name: field.default
        for field in dataclasses.fields(pipeline.PipelineConfig)})
    config = dataclasses.replace(config, pipeline=unpipelined)
  try:
    check_hooks(task, single.strategy, config, runtime)
  except HookFailed as e:
    report(False, e.hook, e.problem)
    report(None, "input, replicas, resume", f"fix {e.hook} first")
    return False

  one = build_run(task, single, config, runtime)
  initial = get_weights(one.model)
  many = build_run(task, mirrored, config, runtime, weights=initial)
  input_difference = max_difference(
      tf.nest.flatten(one.first_batch, expand_composites=True),
      tf.nest.flatten(many.first_batch, expand_composites=True))
  same_input = input_difference == 0.0
  if same_input:
    report(True, "input", "two builds give the same first batch")
  else:
    report(False, "input", "two builds of the training input give different "
           f"first batches (max difference {input_difference:.3g}): make "
           "build_inputs deterministic (seed shuffles and random ops)")

  half = steps // 2
  # As `train.py` resumes: the iterator in the checkpoint when it can be
  # saved, otherwise the consumed batches skipped.
  with_input = inputs_lib.is_checkpointable(one.train_input.dataset)
  with tempfile.TemporaryDirectory(  # local-path: the check's own scratch
      prefix="check_task-") as directory:
    losses_one = one.train(half)
    saved = one.checkpoint(with_input).write(os.path.join(directory, "ckpt"))
    state = input_state.checkpoint_bytes(saved)
    if state is not None:
      print(f"check_task | input state: {input_state.format_bytes(state)} "
            "in the checkpoint (the training iterator's position and "
            "buffers)", flush=True)
    losses_one += one.train(steps - half)
    losses_many = many.train(steps)
    resumed = build_run(task, single, config, runtime, weights=initial)
    resumed.checkpoint(with_input).read(
        saved).assert_existing_objects_matched()
    if not with_input:
      resumed.trainer.skip_input(half)
    resumed.train(steps - half)
  replicas_ok = compare_replicas(one, many, losses_one, losses_many,
                                 same_input)
  resume_ok = compare_resume(one, resumed, half, same_input)
  eval_ok = compare_eval_sets(task, one, many, config, runtime)
  return same_input and replicas_ok and resume_ok and eval_ok


def evaluate_sets(task: task_lib.Task, run: Run,
                  config: trainer.TrainerConfig,
                  runtime: trainer.RuntimeConfig
                  ) -> Dict[Optional[str], Dict[str, float]]:
  """Each evaluation set's results with `run`'s model, in its strategy, as
  `train.py` evaluates them (a full pass, the partial last batch split over
  the replicas; a set of a size tf.data does not know, which may never
  end, the `trainer.validation_steps` batches `train.py` reads where they
  are counted); by set name, None for a Task's one unnamed set."""
  strategy = run.trainer.strategy
  results = {}
  # Each set's evaluator traces its own step: TensorFlow's retracing
  # warning would name the framework's evaluator between the lines.
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel("ERROR")
  try:
    for name, eval_input in inputs_lib.for_eval_sets(
        task, strategy, config, runtime).items():
      evaluator = evaluator_lib.TaskEvaluator(
          task, run.model, strategy, eval_input, run.trainer.global_step,
          set_name=name)
      steps = -1
      if int(eval_input.dataset.cardinality()) < 0:
        # A size tf.data does not know, perhaps endless (Model Garden's
        # mock): the batches `train.py` evaluates, where they are counted.
        steps = eval_sets.steps_for(config.validation_steps, name)
      results[name] = evaluator.evaluate(tf.constant(steps))
  finally:
    logger.setLevel(level)
  return results


def _relative_difference(one: float, many: float) -> float:
  """|one - many| relative to |one| where above 1; inf where one of them
  is not finite and the other is (0 where both are the same NaN or inf)."""
  if not (np.isfinite(one) and np.isfinite(many)):
    same = (np.isnan(one) and np.isnan(many)) or one == many
    return 0.0 if same else float("inf")
  return abs(one - many) / max(abs(one), 1.0)


def compare_eval_sets(task: task_lib.Task, one: Run, many: Run,
                      config: trainer.TrainerConfig,
                      runtime: trainer.RuntimeConfig) -> bool:
  """Reports, for each evaluation set, whether its results with the same
  weights agree on one device and on replicas."""
  set_weights(many.model, get_weights(one.model))
  try:
    on_one = evaluate_sets(task, one, config, runtime)
    on_many = evaluate_sets(task, many, config, runtime)
  except errors.ConfigError as e:
    report(False, "eval", str(e))
    return False
  num_replicas = many.trainer.strategy.num_replicas_in_sync
  passed = True
  for name, results in on_one.items():
    label = "eval" if name is None else f"eval {name}"
    differences = {
        metric: _relative_difference(value, on_many[name][metric])
        for metric, value in results.items()}
    figures = "; ".join(
        f"{metric} {value:.6g} / {on_many[name][metric]:.6g}"
        for metric, value in results.items())
    text = (f"the same weights on 1 / {num_replicas} replicas: {figures}; "
            f"max difference {max(differences.values()):.2g}")
    if max(differences.values()) <= TOLERANCE:
      report(True, label, text)
      continue
    passed = False
    worst = max(differences, key=differences.get)
    report(False, label, f"{text}. Likely cause: `{worst}` depends on how "
           "the batches are split over replicas: update metrics with per-example "
           "values, not a statistic of each replica's batch (a replica may "
           "get few examples of the last batch, or none)")
  return passed


def compare_replicas(one: Run, many: Run, losses_one: List[float],
                     losses_many: List[float], same_input: bool) -> bool:
  """Reports whether both runs' losses and final weights agree."""
  num_replicas = many.trainer.strategy.num_replicas_in_sync
  final = get_weights(one.model)
  weight_difference = max_difference(final, get_weights(many.model))
  weight_tolerance = TOLERANCE * scale(final)
  loss_difference = max(abs(a - b) / max(abs(a), 1.0)
                        for a, b in zip(losses_one, losses_many))
  loss_ratio = losses_many[0] / losses_one[0] if losses_one[0] else 1.0
  figures = (
      f"loss on 1 / {num_replicas} replicas: step 1 {losses_one[0]:.6g} / "
      f"{losses_many[0]:.6g} (ratio {loss_ratio:.4f}), step "
      f"{len(losses_one)} {losses_one[-1]:.6g} / {losses_many[-1]:.6g}; max "
      f"weight difference {weight_difference:.2g} (tolerance "
      f"{weight_tolerance:.2g})")
  if loss_difference <= TOLERANCE and weight_difference <= weight_tolerance:
    report(True, "replicas", figures)
    return True
  causes = []
  if not same_input:
    causes.append(DIFFERENT_INPUT_CAUSE)
  averaged = abs(loss_ratio - num_replicas) < 0.05 * num_replicas
  differing = []
  if named.several(one.model):
    differing = [repr(name) for name, difference in model_differences(
        one.model, many.model).items() if difference > weight_tolerance]
  # One cause for one mistake: with several models, the models it names.
  if averaged and differing:
    causes.append(
        "the train_step averages the loss over the per-replica batch (the "
        f"update of {', '.join(differing)} differs with the replica count); "
        "divide by the global batch: tf.nn.compute_average_loss")
  elif averaged:
    causes.append(AVERAGING_CAUSE)
  elif differing:
    causes.append(
        f"the update of {', '.join(differing)} differs with the replica "
        "count: its loss is likely averaged over each replica's examples, "
        "not the global batch (use tf.nn.compute_average_loss on "
        "per-example losses)")
  for name in [n for model in named.named(one.model).values()
               for n in unsynchronized_batch_norms(model)]:
    causes.append(f"BatchNormalization layer '{name}' normalises each "
                  "replica's batch on its own: use "
                  "BatchNormalization(synchronized=True)")
  random_ops = (actions.stateful_random_ops(one.trainer.traced_loop()) or
                actions.stateful_random_ops(many.trainer.traced_loop()))
  if random_ops:
    causes.append(random_ops_cause(random_ops))
  causes = causes or ["unknown: compare the task's train_step with "
                      "trainer.Task.train_step"]
  report(False, "replicas", f"{figures}. Likely cause: {'; '.join(causes)}")
  return False


def compare_resume(one: Run, resumed: Run, saved_step: int,
                   same_input: bool) -> bool:
  """Reports whether the resumed run ended with the uninterrupted weights."""
  final = get_weights(one.model)
  difference = max_difference(final, get_weights(resumed.model))
  steps = int(one.trainer.global_step.numpy())
  figures = (
      f"{saved_step} step(s), checkpoint, restore into a new model and "
      f"optimizer, {steps - saved_step} step(s) vs {steps} steps: max weight "
      f"difference {difference:.2g}")
  if difference <= TOLERANCE * scale(final):
    report(True, "resume", figures)
    return True
  random_ops = actions.stateful_random_ops(one.trainer.traced_loop())
  if not same_input:
    cause = DIFFERENT_INPUT_CAUSE
  elif random_ops:
    cause = random_ops_cause(random_ops)
  else:
    cause = "state outside the checkpoint (model, optimizer, step, input)"
  report(False, "resume", f"{figures}. Likely cause: {cause}")
  return False


def main(unused_gin_files: List[str], task: trainer.Task,
         runtime: trainer.RuntimeConfig,
         config: trainer.TrainerConfig) -> None:
  console.configure(verbosity_asked=FLAGS["verbosity"].present)
  try:
    passed = check(task, runtime, config)
  except errors.ConfigError as e:
    cli.fail(str(e), program=PROGRAM)
  name = type(task).__name__
  if passed:
    print(f"check_task | PASS: {name} trains the same on 1 and "
          f"{FLAGS.replicas} replicas and resumes exactly", flush=True)
    return
  print(f"check_task | FAIL: {name}", flush=True)
  sys.exit(1)


if __name__ == "__main__":
  cli.run_tool(main, PROGRAM, "gin/digits.gin")
