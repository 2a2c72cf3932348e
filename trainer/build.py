"""Builds what a run needs: the process's strategy, the parts, the controller.

One place assembles the framework's pieces, so `train.py` (through
`trainer.experiment`) and the tools in `scripts/` train through the same
objects:

  process     the strategy, the precision policy, the seeds and this
              process's place among the workers;
  parts       the inputs, the training state (`trainer.state`), the Orbit
              trainer and evaluator, and what a checkpoint holds
              (`checkpoint_items`, its one definition);
  controller  the checkpoint manager, the hooks around a loop, the actions
              after a loop and after an evaluation, and the controller.
"""

import dataclasses
import functools
import os
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import tensorflow as tf
import tf_keras

from trainer import actions
from trainer import config as config_lib
from trainer import console
from trainer import errors
from trainer import runtime as runtime_lib
from trainer import state as state_lib
from trainer.actions import keras_callbacks as keras_callbacks_lib
from trainer.actions import metrics_csv
from trainer.data import input_state
from trainer.data import inputs as inputs_lib
from trainer.data import service as data_service
from trainer.distribute import cluster
from trainer.distribute import parameter_server
from trainer.distribute import pipeline
from trainer.distribute import placement
from trainer.distribute import strategy as strategy_lib
from trainer.loop.control import controller as controller_lib
from trainer.loop.control import profiler
from trainer.loop.control import reporter
from trainer.loop.control import rollback
from trainer.loop.control import watcher as watcher_lib
from trainer.loop.runner import evaluator as evaluator_lib
from trainer.loop.runner import runners
from trainer.loop.runner import scheduled_trainer
from trainer.model import gradients
from trainer.model import named
from trainer.model import pipelined
from trainer.model import precision
from trainer.model import scaling
from trainer.model import seeds
from trainer.model import task as task_lib
from trainer.report import summaries
from trainer.storage import checkpoints
from trainer.storage import evaluated
from trainer.storage import exports
from trainer.storage import worker_inputs



@dataclasses.dataclass(frozen=True)
class Process:
  """This process, set up for a run.

  Attributes:
    runtime: The runtime settings it was set up with.
    strategy: Where the variables live and the steps run.
    worker: This process's place among the workers.
  """
  runtime: runtime_lib.RuntimeConfig
  strategy: tf.distribute.Strategy
  worker: cluster.WorkerInfo


def set_up(runtime: runtime_lib.RuntimeConfig) -> cluster.Membership:
  """Checks the settings that need the data service or the cluster, and
  joins the cluster: once a process, before anything is written."""
  data_service.check(runtime)
  return strategy_lib.set_up(runtime)


def process(runtime: runtime_lib.RuntimeConfig,
            membership: Optional[cluster.Membership] = None) -> Process:
  """Creates the strategy, sets the precision policy and the seeds; sets
  the process up first (`set_up`) unless `membership` says it was."""
  if membership is None:
    membership = set_up(runtime)
  strategy = strategy_lib.create_strategy(runtime, membership)
  precision.set_precision_policy(runtime)
  seeds.seed_everything(runtime)
  return Process(runtime, strategy, cluster.worker_info(strategy))


@dataclasses.dataclass
class Parts:
  """What a run builds for a mode before the controller.

  Attributes:
    task: What is trained.
    config: The loop settings, with batches rescaled for the replicas.
    runtime: The runtime settings.
    worker: This process's place among the workers.
    training: Whether the mode trains.
    evaluating: Whether the mode evaluates.
    state: The model, optimizer and global step.
    checkpoint: What checkpoints hold (`checkpoint_items`).
    trainer: Orbit trainer, when training.
    evaluator: Orbit evaluator, when evaluating: a `SetsEvaluator` where
      the Task returns named evaluation sets.
    resume_input_fn: Puts the input where the run at the step it is given
      left it, where the iterator is not in the checkpoint (each worker's
      saved position, or a skip of the batches consumed); returns the
      `input |` line saying how. None otherwise.
    worker_positions: Whether each worker saves its input position beside
      the chief's checkpoints (`trainer.storage.worker_inputs`).
    restarts_input: Whether a resumed run reads the training input from
      its start.
    features_spec: The eval input's features, for export signatures.
    eval_set_names: The named evaluation sets evaluated, in order; () for
      a Task's one unnamed set (or no evaluation).
    eval_inputs: Each evaluation set's input by name (`{None: input}` for
      a Task's one unnamed set); None where nothing is evaluated or
      exported.
  """
  task: task_lib.Task
  config: config_lib.TrainerConfig
  runtime: runtime_lib.RuntimeConfig
  worker: cluster.WorkerInfo
  training: bool
  evaluating: bool
  state: state_lib.TrainState
  checkpoint: Optional[tf.train.Checkpoint] = None
  trainer: Optional[runners.TaskTrainer] = None
  evaluator: Optional[Union[evaluator_lib.TaskEvaluator,
                            evaluator_lib.SetsEvaluator]] = None
  resume_input_fn: Optional[Callable[[int], str]] = None
  worker_positions: bool = False
  restarts_input: bool = False
  features_spec: Any = None
  eval_set_names: Tuple[str, ...] = ()
  eval_inputs: Optional[Dict[Optional[str],
                             inputs_lib.DistributedInput]] = None

  def export(self, directory: str) -> None:
    """Writes a serving SavedModel (EMA weights, if any) to `directory`: of
    the model, or of the one `export.model` names."""
    model = self.state.model
    if named.several(model):
      model = model[self.config.export.model]
    with self.state.averaged_weights():
      exports.export(
          model, self.task.export_signatures(model, self.features_spec),
          directory)


def checkpoint_items(state: state_lib.TrainState,
                     trainer: Optional[runners.TaskTrainer] = None,
                     with_input: bool = False) -> Dict[str, Any]:
  """What a checkpoint holds, by name: the model, the global step, the
  optimizer if any; with a `trainer`, its count of discarded batches, the
  batch size its input is read in (`checkpoints.BATCH_SIZE`) and, if
  `with_input`, its input position (`checkpoints.INPUT_POSITION`). A
  model's own `checkpoint_items` (Model Garden's: its `backbone`, which a
  Task's `init_checkpoint_modules` reads) are added, as Model Garden's
  trainer adds them."""
  items = {"model": state.model, "global_step": state.global_step}
  if not named.several(state.model):
    for name, item in (getattr(state.model, "checkpoint_items", None)
                       or {}).items():
      items.setdefault(name, item)
  if state.optimizer is not None:
    items["optimizer"] = state.optimizer
  if trainer is not None:
    items["discarded_batches"] = trainer.discarded_batches
    items[checkpoints.BATCH_SIZE] = trainer.input_batch_size
    if with_input:
      items[checkpoints.INPUT_POSITION] = trainer.train_iterator
  return items


def state(task: task_lib.Task, setup: Process, element_spec,
          config: config_lib.TrainerConfig, *, training: bool,
          replica_factor: float = 1.0,
          optimizer_fn: Optional[
              Callable[[], tf_keras.optimizers.Optimizer]] = None
          ) -> state_lib.TrainState:
  """Builds the model(s), optimizer(s) and global step in `setup`'s
  strategy (see `trainer.state.build`)."""
  return state_lib.build(task, setup.strategy, element_spec, config,
                         setup.runtime, training=training,
                         replica_factor=replica_factor,
                         optimizer_fn=optimizer_fn)


def trainer(task: task_lib.Task, train_state: state_lib.TrainState,
            train_input: inputs_lib.DistributedInput,
            config: config_lib.TrainerConfig,
            runtime: runtime_lib.RuntimeConfig) -> runners.TaskTrainer:
  """Builds the Orbit trainer: steps scheduled on a parameter-server
  cluster's workers, or run by the strategy here."""
  trainer_class = (scheduled_trainer.ScheduledTaskTrainer
                   if parameter_server.uses(train_state.strategy)
                   else runners.TaskTrainer)
  return trainer_class(
      task, train_state.model, train_state.optimizer, train_state.strategy,
      train_input, train_state.global_step, run_eagerly=runtime.run_eagerly,
      enable_xla=runtime.enable_xla,
      step_options=_step_options(task, train_state, config),
      model_options=_model_options(train_state, config),
      check_loss_scaling=config.check_loss_scaling)


def _model_options(train_state: state_lib.TrainState,
                   config: config_lib.TrainerConfig
                   ) -> Optional[Dict[str, gradients.StepOptions]]:
  """With several models, each one's clipping (bound under its name, else
  the run's), by name: what `trainer.minimize` applies with its optimizer;
  None with one model (the default step takes `_step_options`)."""
  if not named.several(train_state.optimizer):
    return None
  return {name: state_lib.scoped_clipping(name, config)
          for name in train_state.optimizer}


def _step_options(task: task_lib.Task, train_state: state_lib.TrainState,
                  config: config_lib.TrainerConfig) -> gradients.StepOptions:
  """The default train step's options; a pipelined model's forward and
  backward pass in place of `Task.compute_gradients`."""
  options = gradients.StepOptions.from_config(config)
  if train_state.stages is None:
    return options
  examples = (config.global_batch_size //
              train_state.strategy.num_replicas_in_sync //
              config.gradient_accumulation_steps)
  return dataclasses.replace(options, gradient_fn=pipelined.gradient_fn(
      task, train_state.stages, config.pipeline,
      micro_batch_examples=examples))


def parts(task: task_lib.Task, mode: str, setup: Process,
          config: config_lib.TrainerConfig) -> Parts:
  """Builds the inputs, training state and Orbit runners of `mode` (one of
  `trainer.experiment.MODES`) in the process `setup`."""
  training = mode in ("train", "train_and_eval")
  evaluating = mode != "train"
  strategy, runtime, worker = setup.strategy, setup.runtime, setup.worker
  config, replica_factor = _rescale(config, strategy.num_replicas_in_sync)
  console.log(f"strategy {type(strategy).__name__} with "
              f"{strategy.num_replicas_in_sync} replica(s); worker "
              f"{worker.worker_index} of {worker.num_workers}")
  # Before the inputs, which start TensorFlow's devices.
  pipeline.set_up(config.pipeline, runtime)
  train_input, eval_inputs = inputs_lib.for_mode(
      task, strategy, config, runtime, worker, training, evaluating)
  # Named sets are checked to hold examples of one kind by the model.
  eval_input = next(iter(eval_inputs.values())) if eval_inputs else None
  set_names = tuple(name for name in eval_inputs or () if name is not None)
  built_state = state(task, setup,
                      (train_input or eval_input).element_spec,
                      config, training=training, replica_factor=replica_factor)
  _report_placement(built_state, runtime)
  if (config.export.at_end or config.export.best or
      config.export.model is not None):  # A bound name is checked, used or not.
    named.check_choice("export.model", config.export.model, built_state.model)
  found = Parts(
      task=task, config=config, runtime=runtime, worker=worker,
      training=training, evaluating=evaluating, state=built_state,
      features_spec=eval_input.dataset.element_spec[0] if eval_input else None,
      eval_set_names=set_names if evaluating else (),
      eval_inputs=eval_inputs)
  position = None
  if training:
    found.trainer = trainer(task, built_state, train_input, config, runtime)
    position = found.trainer.input_resumption(config.input_position,
                                              worker.num_workers)
    if position in ("skip", "workers"):
      found.resume_input_fn = functools.partial(_skip_input, found.trainer)
    found.worker_positions = position == "workers"
    found.restarts_input = position == "restart"
  if evaluating:
    found.evaluator = _evaluator(task, built_state, eval_inputs, config,
                                 runtime)
  found.checkpoint = tf.train.Checkpoint(**checkpoint_items(
      built_state, found.trainer, with_input=position == "checkpoint"))
  return found


def _skip_input(task_trainer: runners.TaskTrainer, step: int) -> str:
  """Skips the batches consumed up to `step`; returns the line saying so."""
  skipped = task_trainer.skip_input(step)
  return f"input | resuming: skips the {skipped} batch(es) trained on before"


def _worker_positions(built: Parts, model_dir: str
                      ) -> worker_inputs.WorkerInputs:
  """Each worker's input positions beside the checkpoints in `model_dir`;
  makes `built.resume_input_fn` restore this worker's, or skip where it
  has none of the step."""
  strategy = built.state.strategy
  task_trainer = built.trainer

  def barrier() -> None:
    # One all-reduce: every worker has written its position of the step.
    strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.experimental_distribute_values_from_function(
            lambda unused_context: tf.constant(1.0)), axis=None).numpy()

  positions = worker_inputs.WorkerInputs(
      model_dir, built.worker.num_workers, built.worker.worker_index,
      lambda: task_trainer.train_iterator, barrier)

  def resume(step: int) -> str:
    return positions.restore(step) or _skip_input(task_trainer, step)

  built.resume_input_fn = resume
  return positions


def _evaluator(task: task_lib.Task, built_state: state_lib.TrainState,
               eval_inputs: Dict[Optional[str], inputs_lib.DistributedInput],
               config: config_lib.TrainerConfig,
               runtime: runtime_lib.RuntimeConfig):
  """The Orbit evaluator: of the Task's one unnamed set, or one evaluator a
  named set, each with its own metrics, under one `SetsEvaluator`."""
  if list(eval_inputs) == [None]:
    return evaluator_lib.TaskEvaluator(
        task, built_state.model, built_state.strategy, eval_inputs[None],
        built_state.global_step, run_eagerly=runtime.run_eagerly,
        weights=built_state.averaged_weights)
  return evaluator_lib.SetsEvaluator(
      {name: evaluator_lib.TaskEvaluator(
          task, built_state.model, built_state.strategy, eval_input,
          built_state.global_step, run_eagerly=runtime.run_eagerly,
          set_name=name)
       for name, eval_input in eval_inputs.items()},
      steps=config.validation_steps, weights=built_state.averaged_weights)


def _report_placement(built_state: state_lib.TrainState,
                      runtime: runtime_lib.RuntimeConfig) -> None:
  """Says where the variables live, read back from them, when a model is
  split over devices or its variables over parameter servers."""
  lines = []
  for model in named.named(built_state.model).values():
    if (runtime.model_parallel_devices > 1 or
        built_state.stages is not None or
        parameter_server.uses(built_state.strategy)):
      lines += placement.variables_by_device(model)
    if parameter_server.uses(built_state.strategy):
      lines += parameter_server.shard_lines(model.variables)
  for line in lines:
    console.info(f"placement | {line}")


def _rescale(config: config_lib.TrainerConfig,
             num_replicas: int) -> Tuple[config_lib.TrainerConfig, float]:
  """Applies `trainer.batch_scaling`; returns the config and the learning
  rate factor."""
  config, replica_factor = scaling.rescale(config, num_replicas)
  if config.batch_scaling is not None:
    console.info(
        f"scaling | {num_replicas} replica(s), reference "
        f"{config.reference_replicas}: global batch "
        f"{config.global_batch_size}, eval batch {config.eval_batch_size}, "
        f"learning rate x{replica_factor:g}")
  return config, replica_factor


def early_stopping(built: Parts,
                   write_dir: str) -> Optional[actions.EarlyStopping]:
  """Builds early stopping (a hook and an eval action) if a metric is set."""
  if built.config.early_stopping.metric is None:
    return None
  return actions.EarlyStopping(write_dir, built.config.early_stopping,
                               step_fn=built.state.step)


def keras_callbacks(
    built: Parts) -> Optional[keras_callbacks_lib.KerasCallbacks]:
  """Builds the runner of `trainer.callbacks` (a hook and an eval action)
  where a training mode has any.

  Raises:
    errors.ConfigError: With several models: a callback's `model` is one.
  """
  config = built.config
  if not (config.callbacks and built.training):
    return None
  if named.several(built.state.model):
    raise errors.ConfigError(
        "`trainer.callbacks` needs a Task with one model: a Keras callback "
        f"gets one `model`, and this Task builds "
        f"{len(named.named(built.state.model))} "
        f"({', '.join(named.named(built.state.model))}).")
  interval = (config.validation_interval if built.evaluating
              else config.summary_interval)
  return keras_callbacks_lib.KerasCallbacks(
      config.callbacks, built.state.model, built.state.step,
      train_steps=config.train_steps,
      epoch_steps=interval or config.train_steps, evaluating=built.evaluating)


def controller(built: Parts, write_dir: str, *,
               restore_dir: Optional[str] = None,
               watcher: Optional[watcher_lib.Watcher] = None,
               stopper: Optional[actions.EarlyStopping] = None,
               callbacks: Optional[keras_callbacks_lib.KerasCallbacks] = None,
               saves: bool = True,
               input_stale_until: int = -1,
               directory_identity: Optional[Tuple[int, int]] = None
               ) -> controller_lib.Controller:
  """Builds the controller (which restores the newest checkpoint) and the
  actions between loops.

  Args:
    built: The parts.
    write_dir: Where checkpoints and `train/`, `eval/` summaries go.
    restore_dir: Where to look for the checkpoint to restore, if not in
      `write_dir`.
    watcher: Watches for SIGTERM/SIGINT while training.
    stopper: Early stopping, from `early_stopping`.
    callbacks: The Keras callbacks, from `keras_callbacks`.
    saves: Whether there are checkpoints at all: a benchmark times the
      loop without them.
    input_stale_until: Restore no input position from checkpoints of
      steps up to this one (saved with another batch size).
    directory_identity: `write_dir`'s `files.directory_identity` when the
      run took it (`ControllerOptions.directory_identity`).
  """
  config, training, train_state = built.config, built.training, built.state
  manager = None
  if saves:
    manager = checkpoints.create_manager(
        built.checkpoint, write_dir, config.max_to_keep,
        train_state.global_step,
        init_fn=((lambda: built.task.initialize(train_state.model,
                                                config.warm_start))
                 if training else None),
        evaluated_fn=(
            (lambda: evaluated.steps(write_dir))
            if training and config.keep_until_evaluated else None))
  positions = (_worker_positions(built, restore_dir or write_dir)
               if training and built.worker_positions else None)
  found = None

  def restored_path() -> Optional[str]:
    # Asked only after an evaluation, so once the controller exists.
    return found.restored_path

  train = _TrainingCollaborators()
  # `metrics.csv`: the training process's summaries and evaluations.
  csv = (metrics_csv.MetricsCsv(write_dir, train_state.step,
                                set_names=built.eval_set_names)
         if training else None)
  if training:
    train = _training_collaborators(built, write_dir, stopper, csv, callbacks)
  found = controller_lib.Controller(
      global_step=train_state.global_step, trainer=built.trainer,
      evaluator=built.evaluator, strategy=train_state.strategy,
      train_actions=train.actions,
      eval_actions=[*_eval_actions(built, restored_path, write_dir, stopper),
                    *(action for action in (csv, callbacks)
                      if action is not None and built.evaluating)],
      # `trainer.steps_per_loop`: each call of the runner's `train(num_steps)`
      # runs at most this many steps, and loops end at its multiples.
      steps_per_loop=config.steps_per_loop if training else None,
      checkpoint_manager=manager,
      # Orbit gives an evaluator the train summaries' manager unless this
      # differs from `summary_dir`; the manager below writes there.
      eval_summary_dir=(os.path.join(write_dir, "eval")
                        if built.evaluating else None),
      # Lazy writers, which do not make a deleted `model_dir` again; named
      # sets: one TensorBoard run each, `eval/<set>`.
      eval_summary_manager=(
          summaries.RunsSummaryManager(os.path.join(write_dir, "eval"),
                                       built.eval_set_names,
                                       train_state.global_step,
                                       model_dir=write_dir)
          if built.evaluating else None),
      options=controller_lib.ControllerOptions(
          checkpoint_interval=config.checkpoint_interval if saves else None,
          restore_dir=restore_dir, partial_restore=not training,
          input_stale_until=input_stale_until,
          directory_identity=directory_identity),
      guard=train.guard, preemption=watcher if training else None,
      hooks=train.hooks,
      restored_fn=_after_restore(built) if training else None,
      saved_fn=_InputStateReport(built) if training else None,
      saving_fn=(_PositionSaves(built, positions) if positions is not None
                 else None),
      held_out_sets=config.held_out_sets)
  if csv is not None:  # Training goes on from the step restored.
    csv.restarted(found.step)
  return found


class _InputStateReport:
  """What the controller calls after each save: after the run's first, says
  how many bytes of input state the checkpoint holds and warns, naming the
  pipeline's buffers, where they are many (`input_state.report`); nothing
  where the checkpoint holds no iterator."""

  def __init__(self, built: Parts):
    self._built = built
    self._done = False

  def __call__(self, path: str) -> None:
    if self._done:
      return
    self._done = True
    input_state.report(
        path, self._built.trainer.train_input.dataset,
        input_state.model_bytes(named.variables(self._built.state.model)))


class _PositionSaves:
  """What the controller calls before each save with several workers:
  writes this worker's input position of the step; after the first, says
  how many bytes it holds (`input_state.report`)."""

  def __init__(self, built: Parts, positions: worker_inputs.WorkerInputs):
    self._positions = positions
    self._report = _InputStateReport(built)

  def __call__(self, step: int) -> None:
    self._report(self._positions.save(step))


def _after_restore(built: Parts) -> Callable[[], None]:
  """What the controller calls after every restore (the first, a
  rollback's): the run's settings, not the checkpoint's, from then on."""

  def restored() -> None:
    built.state.assign_hyperparameters()
    built.trainer.input_restored()

  return restored


@dataclasses.dataclass(frozen=True)
class _TrainingCollaborators:
  """The controller's arguments that only training needs.

  Attributes:
    actions: Called after every loop with the runner's output.
    guard: What a non-finite loss does; None: the controller's default.
    hooks: Around every loop, in the order they report.
  """
  actions: Tuple[Callable[[Any], None], ...] = ()
  guard: Optional[rollback.NonFiniteGuard] = None
  hooks: Tuple[Any, ...] = ()


def _training_collaborators(
    built: Parts, write_dir: str,
    stopper: Optional[actions.EarlyStopping],
    csv: metrics_csv.MetricsCsv,
    callbacks: Optional[keras_callbacks_lib.KerasCallbacks]
) -> _TrainingCollaborators:
  """Returns the train actions, the guard and the hooks around a loop (in
  the order they report: progress line, profile, early stopping, the Keras
  callbacks, `metrics.csv`'s rollback)."""
  config, train_state = built.config, built.state
  writer = summaries.LazyWriter(os.path.join(write_dir, "train"),
                                model_dir=write_dir)
  hooks = [reporter.TrainReporter(
      writer, train_steps=config.train_steps,
      global_batch_size=config.global_batch_size,
      summary_interval=config.summary_interval,
      scalars_fn=lambda: state_lib.loss_scale_scalars(train_state.optimizer),
      summary_fns=[hook.train_summary for hook in (csv, callbacks)
                   if hook is not None],
      bar=console.interactive())]
  if config.profile_steps:
    hooks.append(profiler.ProfileWindow(config.profile_steps,
                                        os.path.join(write_dir, "train"),
                                        model_dir=write_dir))
  hooks.extend(hook for hook in (stopper, callbacks, csv) if hook is not None)
  return _TrainingCollaborators(
      actions=(actions.OperativeConfigWriter(write_dir, writer),
               actions.StatefulRandomCheck(built.trainer.traced_loop,
                                           built.runtime.deterministic)),
      guard=rollback.NonFiniteGuard(
          config.on_nonfinite, config.max_rollbacks,
          finite_fn=train_state.all_finite,
          resume_input_fn=built.resume_input_fn),
      hooks=tuple(hooks))


def _eval_actions(built: Parts, restored_path: Callable[[], Optional[str]],
                  write_dir: str,
                  stopper: Optional[actions.EarlyStopping]) -> List[Any]:
  """Returns the actions after each evaluation: best checkpoint, early
  stopping, the eval images, the record of evaluated steps.

  `restored_path` returns the checkpoint the controller restored last: an
  evaluated checkpoint on disk is kept as the best by copying it.
  """
  if not built.evaluating:
    return []
  chosen = []
  if built.config.best_checkpoint.metric is not None:

    def save_best(prefix: str) -> None:
      restored = restored_path()
      if not built.training or (
          restored and checkpoints.saved_step(restored) == built.state.step()):
        # The evaluated state is a checkpoint on disk (evaluated alone, or
        # restored and not trained since): copy it, optimizer and all. The
        # state in memory lacks the optimizer slots until the first step
        # (a restore fills them only once a step creates them).
        checkpoints.copy(restored, prefix)
      else:
        built.checkpoint.write(prefix)

    chosen.append(actions.BestCheckpoint(
        write_dir, built.config.best_checkpoint, step_fn=built.state.step,
        save_fn=save_best,
        export_fn=built.export if built.config.export.best else None))
  if stopper is not None:
    chosen.append(stopper)
  if built.eval_set_names:  # Each set's in its own run.
    chosen.extend(
        actions.EvalImagesWriter(
            os.path.join(write_dir, "eval", name),
            lambda name=name: built.evaluator.evaluators[name].images,
            step_fn=built.state.step, model_dir=write_dir)
        for name in built.eval_set_names)
  else:
    chosen.append(actions.EvalImagesWriter(
        os.path.join(write_dir, "eval"), lambda: built.evaluator.images,
        step_fn=built.state.step, model_dir=write_dir))
  if built.training:
    chosen.append(actions.EvaluatedStepRecorder(write_dir,
                                                step_fn=built.state.step))
  return chosen
