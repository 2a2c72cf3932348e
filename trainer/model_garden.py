"""Model Garden experiments and Tasks, run unchanged: `model_garden_task`.

    experiment.task = @model_garden_task()
    model_garden_task.experiment = "image_classification"
    model_garden_task.config_file = "my_experiment.yaml"
    model_garden_task.params_override = "trainer.train_steps=1000"

builds the experiment config as Model Garden's `train.py --experiment
--config_file --params_override` does (`exp_factory.get_exp_config`, then
`override_params_dict` for each file and the override, strictly, then
`validate`), and the Task `task_factory.get_task` makes for it.
`ModelGardenTask` then runs that Task's own hooks in this framework's loop:
`build_model` and `initialize`, `build_inputs` with the experiment's
`task.train_data` and `task.validation_data` (and the run's
`InputContext`), `build_metrics`, its `train_step` (with Model Garden's loss
scaling) and `validation_step`, `aggregate_logs` and
`reduce_aggregated_logs`, and `create_optimizer` from
`trainer.optimizer_config` and `runtime`. The user's own experiments and
Tasks are registered by importing their module: an `import` line in the gin
file.

Where both sides set something (steps, intervals, batch sizes, precision,
EMA, the best checkpoint), one rule: the experiment's value is used, and a
gin binding of the same setting overrides it (`settle`); where the two
differ, one `config |` line says which was used. Where the run happens
(`runtime.distribution_strategy`, devices, cluster) is gin's `runtime.*`
alone, as for every Task. docs/coming-from-model-garden.md lists every flag
and field.
"""

# Model Garden's modules are imported where they are used (`_official`), not
# here: every run imports this module (`trainer.experiment`), and
# `official.core` took 0.28 s to import (`python -X importtime`), a cost for
# runs of no Model Garden Task. The annotations that name its types stay
# unevaluated.
from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import os
import typing
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf

from trainer import actions
from trainer import config as config_lib
from trainer import console
from trainer import errors
from trainer import graph_code
from trainer import runtime as runtime_lib
from trainer.data import inputs as inputs_lib
from trainer.model import ema as ema_lib
from trainer.model import optimization
from trainer.model import task as task_lib
from trainer.storage import files

if typing.TYPE_CHECKING:
  from official.core import base_task
  from official.core import config_definitions

# Where the Task's own validation loss travels to `aggregate_logs` (the
# evaluator keeps `loss` for the per-example losses it averages).
GARDEN_LOSS = "model_garden/loss"
# A `reduce_aggregated_logs` result named `loss` is reported under this
# name: `loss` is the mean validation loss (Model Garden's
# `validation_loss`).
REDUCED_LOSS = "reduced_loss"
# Gin's name for it, as settings name it in messages.
NAME = "model_garden_task"

# A `trainer.*` setting -> the experiment's field it shares.
TRAINER_FIELDS = {
    "train_steps": "trainer.train_steps",
    "steps_per_loop": "trainer.steps_per_loop",
    "summary_interval": "trainer.summary_interval",
    "checkpoint_interval": "trainer.checkpoint_interval",
    "validation_steps": "trainer.validation_steps",
    "validation_interval": "trainer.validation_interval",
    "max_to_keep": "trainer.max_to_keep",
    "continuous_eval_timeout": "trainer.continuous_eval_timeout",
    "global_batch_size": "task.train_data.global_batch_size",
    "eval_batch_size": "task.validation_data.global_batch_size",
}
# A `runtime.*` setting -> the experiment's field it shares.
RUNTIME_FIELDS = {
    "mixed_precision_dtype": "runtime.mixed_precision_dtype",
    "loss_scale": "runtime.loss_scale",
    "enable_xla": "runtime.enable_xla",
    "run_eagerly": "runtime.run_eagerly",
    "gpu_thread_mode": "runtime.gpu_thread_mode",
    "per_gpu_thread_count": "runtime.per_gpu_thread_count",
    "dataset_num_private_threads": "runtime.dataset_num_private_threads",
}
# The experiment's fields that say where the run happens: gin's `runtime.*`
# decides, as for every Task.
PLACEMENT_FIELDS = ("distribution_strategy", "num_gpus", "tpu",
                    "worker_hosts", "task_index", "all_reduce_alg",
                    "num_packs")
# The experiment's fields this framework does not read, and what does
# their work here.
UNSUPPORTED_FIELDS = {
    "trainer.train_tf_while_loop": "the steps of a loop always run in one "
                                   "tf.function",
    "trainer.train_tf_function": "`runtime.run_eagerly` runs steps eagerly",
    "trainer.eval_tf_function": "`runtime.run_eagerly` runs steps eagerly",
    "trainer.eval_tf_while_loop": "evaluation steps run one call each",
    "trainer.allow_tpu_summary": "summaries are written between loops",
    "trainer.loss_upper_bound": "`trainer.on_nonfinite` handles a "
                                "non-finite loss",
    "trainer.recovery_begin_steps": "`trainer.on_nonfinite` handles a "
                                    "non-finite loss",
    "trainer.recovery_max_trials": "`trainer.on_nonfinite` and "
                                   "`trainer.max_rollbacks` handle a "
                                   "non-finite loss",
    "trainer.validation_summary_subdir": "evaluation summaries go to "
                                         "model_dir/eval",
    "trainer.preemption_on_demand_checkpoint": "a preempted run always "
                                               "saves its step",
    "runtime.batchnorm_spatial_persistent": "not read",
    "runtime.tpu_enable_xla_dynamic_padder": "not read",
    "runtime.num_cores_per_replica": "`runtime.model_parallel_devices` "
                                     "splits a model",
    "runtime.default_shard_dim": "not read",
    "runtime.use_tpu_mp_strategy": "not read",
}
# Values of the experiment that mean "not set": ours is used.
_UNSET = {
    "trainer.train_steps": (0,),
    "task.train_data.global_batch_size": (0,),
    "task.validation_data.global_batch_size": (0,),
    "runtime.mixed_precision_dtype": (None, ""),
    "runtime.loss_scale": (None, ""),
    "runtime.gpu_thread_mode": (None, ""),
    "runtime.dataset_num_private_threads": (None,),
}


@gin.configurable(NAME)
def model_garden_task(experiment: str = gin.REQUIRED,
                      config_file: Union[None, str, Sequence[str]] = None,
                      params_override: Union[None, str, Dict[str, Any]] = None
                      ) -> "ModelGardenTask":
  """Returns a Model Garden experiment's Task, to bind as
  `experiment.task = @model_garden_task()`.

  The experiment config is built as Model Garden's `train.py` builds it:
  the registered experiment, then each `config_file`, then
  `params_override`, each applied strictly (a key the config lacks is
  refused), then validated. Where its trainer, runtime and data settings
  meet gin's (`trainer.*`, `runtime.*`, `ema.*`, `best_checkpoint.*`), the
  experiment's value is used unless gin binds the setting: the binding
  wins, and a `config |` line says so where they differ.

  Args:
    experiment: The name the experiment is registered under in Model
      Garden's `exp_factory` (`"image_classification"`); the module that
      registers it must be imported (an `import` line in the gin file).
    config_file: A YAML or JSON file (or a list of them, applied in order)
      overriding the experiment, as Model Garden's `--config_file`; a
      relative path is found in the working directory, else in this
      repository.
    params_override: Overrides applied last, as Model Garden's
      `--params_override`: a YAML or JSON string, the path of a YAML file,
      `"a.b=1,c.d=2"`, or a gin dict (`{"trainer": {"train_steps": 100}}`).
  """
  params = experiment_config(experiment, config_file, params_override)
  return ModelGardenTask(experiment, params)


def _official(module: str):
  """Imports one of Model Garden's modules, on first use (see the imports),
  with gin's configuration unlocked: importing `official.core` registers
  gin configurables (`optimizer_factory`), which a locked configuration
  refuses, and a run's is locked by the time its Task is built."""
  with gin.unlock_config():
    return importlib.import_module(module)


def _registry() -> Dict[str, Any]:
  """`exp_factory`'s registry: each experiment name (a/b/c for nested
  registrations) and its config factory."""
  exp_factory = _official("official.core.exp_factory")
  factories = {}

  def walk(collection, prefix):
    for key, value in collection.items():
      if isinstance(value, dict):
        walk(value, f"{prefix}{key}/")
      else:
        factories[f"{prefix}{key}"] = value

  walk(exp_factory._REGISTERED_CONFIGS, "")  # pylint: disable=protected-access
  return factories


# The module that registers all of Model Garden's experiments (official.vision,
# official.nlp and the mock), as its `nlp/train.py` imports it; and the one
# that registers official.vision's alone, as its `vision/train.py` does.
ALL_EXPERIMENTS = "official.common.registry_imports"
VISION_EXPERIMENTS = "official.vision.registry_imports"


def _model_gardens_experiments() -> Dict[str, str]:
  """Model Garden's own experiments, each with the import that registers
  it (`VISION_EXPERIMENTS` for official.vision's, else `ALL_EXPERIMENTS`).

  Imports `ALL_EXPERIMENTS`: only for the message of an experiment that is
  not registered (5.7 s on this CPU), so that it names the right import.
  Empty where that import fails (a dependency of official.nlp missing).
  """
  try:
    _official(ALL_EXPERIMENTS)
  except Exception:  # pylint: disable=broad-except
    return {}
  experiments = {}
  for name, factory in _registry().items():
    module = getattr(factory, "__module__", None) or ""
    if module.startswith("official.vision."):
      experiments[name] = VISION_EXPERIMENTS
    elif module.startswith("official."):  # Not the user's own.
      experiments[name] = ALL_EXPERIMENTS
  return experiments


def _unknown_experiment(name: str) -> errors.ConfigError:
  """The one line for an experiment `name` that is not registered: the
  import that registers it where it is Model Garden's own; else a
  did-you-mean, or the experiments the gin file's imports registered."""
  names = sorted(_registry())
  garden = _model_gardens_experiments()
  if name in garden:
    return errors.ConfigError(
        f"`{NAME}.experiment`: Model Garden's experiment '{name}' is not "
        f"registered: add `import {garden[name]}` to the gin file (an "
        "experiment is registered when its module is imported).")
  close = difflib.get_close_matches(name, sorted(set(names) | set(garden)),
                                    n=1, cutoff=0.6)
  if close:
    where = ("" if close[0] in names else
             f", registered by `import {garden[close[0]]}`")
    known = f" (did you mean '{close[0]}'{where}?)"
  elif names:
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    known = (f"; {len(names)} {'is' if len(names) == 1 else 'are'} "
             f"registered ({shown})")
  else:
    known = "; none is registered"
  return errors.ConfigError(
      f"`{NAME}.experiment`: no Model Garden experiment '{name}' is "
      f"registered{known}. An experiment is registered when its module is "
      "imported: add its `import` line to the gin file (`import "
      f"{ALL_EXPERIMENTS}` registers all of Model Garden's).")


def _one_line(error: BaseException) -> str:
  """An error's message on one line."""
  text = str(error.args[0]) if (
      isinstance(error, KeyError) and error.args) else str(error)
  text = " ".join(text.split()).strip("\"'")
  # Advice for Model Garden's API, not for its flags (nor this binding).
  text = text.split(" To extend the existing keys, use `override`")[0]
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _find_file(path: str) -> str:
  """`path` as given (a URL too: Model Garden reads it through
  `tf.io.gfile`), or below this repository where it is not found in the
  working directory (as gin files are found)."""
  if files.is_url(path) or os.path.isabs(path) or files.exists(path):
    return path
  repository = os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))  # local-path: this repository
  candidate = os.path.join(repository, path)
  return candidate if files.exists(candidate) else path


def experiment_config(experiment: str,
                      config_file: Union[None, str, Sequence[str]] = None,
                      params_override: Union[None, str,
                                             Dict[str, Any]] = None
                      ) -> config_definitions.ExperimentConfig:
  """Builds the experiment config as Model Garden's `train.py` does.

  Raises:
    errors.ConfigError: One line, for an experiment that is not registered
      (with a did-you-mean), a config file that is missing or refused, an
      override Model Garden refuses (its message), a config that does not
      validate, or a Task config no Task is registered for.
  """
  exp_factory = _official("official.core.exp_factory")
  if not isinstance(experiment, str) or not experiment:
    raise errors.ConfigError(
        f"`{NAME}.experiment` ({experiment!r}) must be the name of a "
        "registered Model Garden experiment.")
  try:
    params = exp_factory.get_exp_config(experiment)
  except LookupError:
    raise _unknown_experiment(experiment) from None
  config_files = ([config_file] if isinstance(config_file, str)
                  else list(config_file or ()))
  for path in config_files:
    files.check_path(path, f"`{NAME}.config_file`")
    found = _find_file(path)
    if not files.isfile(found):
      raise errors.ConfigError(f"`{NAME}.config_file`: no such file: {path}")
    _override(params, found, f"`{NAME}.config_file` ({path})")
  if params_override:
    if isinstance(params_override, dict):
      params_override = _plain(params_override)
    elif not isinstance(params_override, str):
      raise errors.ConfigError(
          f"`{NAME}.params_override` ({params_override!r}) must be a YAML "
          "or JSON string, a file, `a.b=1,c.d=2` or a dict.")
    _override(params, params_override, f"`{NAME}.params_override`")
  try:
    params.validate()
  except Exception as e:  # pylint: disable=broad-except
    raise errors.ConfigError(
        f"the experiment '{experiment}' does not validate: "
        f"{_one_line(e)}") from e
  _task_class(params, experiment)
  return params


def _plain(value):
  """A gin dict as plain Python (gin may hand over tuples for lists)."""
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, tuple):
    return [_plain(v) for v in value]
  return value


def _override(params, source, what: str) -> None:
  """Applies `source` strictly, as Model Garden's `--config_file` and
  `--params_override` do.

  Raises:
    errors.ConfigError: With Model Garden's message, on one line.
  """
  hyperparams = _official("official.modeling.hyperparams")
  try:
    hyperparams.override_params_dict(params, source, is_strict=True)
  except Exception as e:  # pylint: disable=broad-except
    raise errors.ConfigError(
        f"{what}: Model Garden refuses it: {_one_line(e)}") from e


def _task_class(params, experiment: str):
  """The Task class (or builder) `task_factory.get_task` uses for the
  experiment's task config.

  Raises:
    errors.ConfigError: If none is registered.
  """
  task_factory = _official("official.core.task_factory")
  task_config = params.task
  if getattr(task_config, "BUILDER", None) is not None:
    return task_config.BUILDER
  try:
    return task_factory.get_task_cls(type(task_config))
  except LookupError:
    raise errors.ConfigError(
        f"the experiment '{experiment}' has a task config "
        f"({type(task_config).__module__}.{type(task_config).__name__}) for "
        "which no Model Garden Task is registered: import the module that "
        "registers it (`@task_factory.register_task_cls`) in the gin "
        "file.") from None


def get_field(params, path: str):
  """The experiment's value at a dotted `path`; None where it has none."""
  value = params
  for name in path.split("."):
    value = getattr(value, name, None)
    if value is None:
      return None
  return value


def _is_set(params, path: str) -> bool:
  """Whether the experiment gives `path` a value (not an unset marker)."""
  value = get_field(params, path)
  return value is not None and value not in _UNSET.get(path, ())


def _bound(configurable: str) -> set:
  """The parameters gin binds for `configurable`, unscoped."""
  return set(optimization.scoped_bindings("", configurable))


def _defaults(cls) -> Dict[str, Any]:
  return {f.name: f.default for f in dataclasses.fields(cls)
          if f.default is not dataclasses.MISSING}


def _ours(configurable: str, config, cls) -> set:
  """The fields of `cls` the user set: bound in gin, or (in `config`, where
  it is built already) other than the default."""
  if config is None:
    return _bound(configurable)
  return _bound(configurable) | {
      name for name, default in _defaults(cls).items()
      if getattr(config, name) != default}


def _built(cls, given, changes: Dict[str, Any]):
  """`given` with `changes`; where it is None, `cls` built with them (gin
  binds the rest)."""
  if given is None:
    return cls(**changes)
  return dataclasses.replace(given, **changes) if changes else given


def _same(a, b) -> bool:
  try:
    return a == b or (isinstance(a, (int, float)) and
                      isinstance(b, (int, float)) and float(a) == float(b))
  except Exception:  # pylint: disable=broad-except
    return False


def _line(setting: str, ours, field: str, theirs) -> str:
  return (f"config | `{setting}` = {ours!r} (gin) over the experiment's "
          f"`{field}` ({theirs!r})")


class ModelGardenTask(task_lib.Task):
  """A Model Garden Task and its experiment config, run as a `trainer.Task`.

  Build it with `model_garden_task`. Each hook calls the Model Garden
  Task's own (`garden`); see the module docstring.

  Attributes:
    experiment: The experiment's registered name.
    params: The experiment config (`ExperimentConfig`), with the run's
      settled values written in (`settle`).
  """

  def __init__(self, experiment: str,
               params: config_definitions.ExperimentConfig):
    self.experiment = experiment
    self.params = params
    self.logging_dir: Optional[str] = None
    self._garden: Optional[base_task.Task] = None
    self._settled: Optional[Tuple[runtime_lib.RuntimeConfig,
                                  config_lib.TrainerConfig]] = None

  @property
  def garden(self) -> base_task.Task:
    """The Model Garden Task (`task_factory.get_task`), made at first use,
    once the run's settings are written into `params`."""
    task_factory = _official("official.core.task_factory")
    if self._garden is None:
      self._garden = task_factory.get_task(self.params.task,
                                           logging_dir=self.logging_dir)
    return self._garden

  @property
  def settled(self) -> bool:
    """Whether `settle` ran."""
    return self._settled is not None

  def describe(self) -> str:
    """`experiment 'mock': official.utils.testing.mock_task.MockTask`."""
    made = _task_class(self.params, self.experiment)
    return (f"experiment '{self.experiment}': "
            f"{getattr(made, '__module__', '?')}."
            f"{getattr(made, '__name__', type(made).__name__)}")

  # The hooks.

  def build_model(self):
    return self.garden.build_model()

  def initialize(self, model, warm_start=None) -> None:
    """The Task's own `initialize` (its `init_checkpoint`), then gin's
    `warm_start.*` if any."""
    self.garden.initialize(model)
    super().initialize(model, warm_start)

  def build_inputs(self, training: bool,
                   input_context: Optional[tf.distribute.InputContext] = None):
    """The Task's `build_inputs` on the experiment's `task.train_data` or
    `task.validation_data`, with this pipeline's `InputContext`.

    Model Garden's readers return batches of the per-replica batch (the
    data config's global batch over `num_replicas_in_sync`); they are
    handed over as blocks of examples (`inputs.examples_from_blocks`),
    which the framework rebatches a block at a time: with the settled batch
    sizes written into the data configs, each batch holds the same examples
    in the same order as under Model Garden's own trainer. An element other
    than a `(features, labels)` pair (a dict, say) travels as a 1-tuple and
    reaches the Task's steps as it was.
    """
    data = (self.params.task.train_data if training
            else self.params.task.validation_data)
    build = self.garden.build_inputs
    if "input_context" in inspect.signature(build).parameters:
      dataset = build(data, input_context=input_context)
    else:
      dataset = build(data)
    if not isinstance(dataset, tf.data.Dataset):
      raise errors.ConfigTypeError(
          f"{type(self.garden).__name__}.build_inputs returned "
          f"{type(dataset).__name__}: a Model Garden Task run here must "
          "return a `tf.data.Dataset` of batches.")
    if not _is_pair(dataset.element_spec):
      dataset = dataset.map(_one_tuple)
    return inputs_lib.examples_from_blocks(dataset)

  def build_metrics(self, training: bool = True):
    return list(self.garden.build_metrics(training=training) or [])

  def create_optimizer(self, settings: optimization.Settings):
    """The Task's `create_optimizer` from the experiment's
    `trainer.optimizer_config` and `runtime` (as Model Garden's
    `train_utils.create_optimizer` calls it, with the differential privacy
    config where the Task takes one). Gin's `optimizer.*` do not apply.

    In float16 the framework adds the loss scaling (with the same
    `loss_scale`, settled), around the EMA optimizer where there is one,
    as Model Garden's factory nests them: the Task's runtime says float32
    for this call, so that the loss is not scaled twice.
    """
    del settings
    train_utils = _official("official.core.train_utils")
    params = self.params
    if params.runtime.mixed_precision_dtype == "float16":
      params = params.replace(runtime={"mixed_precision_dtype": "float32"})
    return train_utils.create_optimizer(self.garden, params)

  @graph_code.written_for_graphs
  def train_step(self, inputs, model, optimizer, metrics=None,
                 options=None):
    """The Task's `train_step`.

    Model Garden's step returns this replica's mean loss and divides it by
    the replica count for the gradient only; the framework sums `loss` over
    replicas, so the loss is divided here: the sum is the replicas' mean,
    Model Garden's `training_loss`.
    """
    del options
    logs = graph_code.user_code(self.garden.train_step)(
        _unwrapped(inputs), model=model, optimizer=optimizer,
        metrics=metrics)
    loss = _loss(self.garden, logs, "train_step")
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return {"loss": tf.cast(loss, tf.float32) / replicas}

  @graph_code.written_for_graphs
  def validation_step(self, inputs, model, metrics=None):
    """The Task's `validation_step`; its loss (a replica's mean) becomes
    each of the replica's examples' loss, so that the framework's mean over
    every example is Model Garden's `validation_loss` (equal where every
    replica's batch is full: `drop_remainder`, the data config's default).
    Its logs, its loss included, go to `aggregate_logs` as Model Garden's
    trainer passes them."""
    inputs = _unwrapped(inputs)
    logs = dict(graph_code.user_code(self.garden.validation_step)(
        inputs, model=model, metrics=metrics))
    size = tf.shape(tf.nest.flatten(inputs)[0])[0]
    loss = logs.pop(self.garden.loss, None)
    if loss is None:  # Model Garden reports no validation loss then.
      logs["loss"] = tf.fill([size], float("nan"))
    else:
      loss = tf.cast(loss, tf.float32)
      logs[GARDEN_LOSS] = loss
      logs["loss"] = tf.broadcast_to(loss, [size])
    return logs

  def aggregate_logs(self, state=None, step_logs=None):
    if isinstance(step_logs, dict) and GARDEN_LOSS in step_logs:
      step_logs = dict(step_logs)
      step_logs[self.garden.loss] = step_logs.pop(GARDEN_LOSS)
    return self.garden.aggregate_logs(state, step_logs)

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    """The Task's `reduce_aggregated_logs`, called as Model Garden calls it
    (only where `aggregate_logs` returned something); a result named `loss`
    is reported as `reduced_loss`."""
    if not aggregated_logs:
      return {}
    results = dict(self.garden.reduce_aggregated_logs(
        aggregated_logs, global_step=global_step) or {})
    if "loss" in results:
      results[REDUCED_LOSS] = results.pop("loss")
    return results

  # The settings.

  def settle(self, runtime: Optional[runtime_lib.RuntimeConfig] = None,
             config: Optional[config_lib.TrainerConfig] = None
             ) -> Tuple[runtime_lib.RuntimeConfig, config_lib.TrainerConfig]:
    """Returns the runtime and trainer settings the run uses, and writes
    them into the experiment config (`params`), so that the Task and its
    readers see the values the loop uses.

    The rule, for every setting both sides have: the experiment's value is
    used; a gin binding (or, built in Python, a value other than the
    default) overrides it, with one `config |` line where they differ. An
    experiment field that means "unset" (0 steps or batch, no precision)
    leaves ours. Placement (`runtime.distribution_strategy`, devices,
    cluster) is ours alone; an experiment that sets another gets a
    `config |` line saying it is not used, as does one setting a field
    nothing here reads.

    Args:
      runtime: The runtime settings built; None builds them from gin's
        bindings and the experiment's values (checked once, merged).
      config: The trainer settings built; None builds them so.

    Raises:
      errors.ConfigError: For gin settings that cannot apply to a Model
        Garden Task (`optimizer.*`, `learning_rate.*`,
        `trainer.optimizer_parts`, gradient clipping and accumulation), and
        settled values that fail the usual checks (naming the experiment's
        fields they came from).
    """
    bound = {
        "trainer": _ours("trainer", config, config_lib.TrainerConfig),
        "runtime": _ours("runtime", runtime, runtime_lib.RuntimeConfig),
        "ema": _ours("ema", config and config.ema, ema_lib.EmaConfig),
        "best_checkpoint": _ours(
            "best_checkpoint", config and config.best_checkpoint,
            actions.BestCheckpointConfig)}
    trainer_changes, taken = self._taken("trainer", TRAINER_FIELDS,
                                         bound["trainer"])
    runtime_changes, taken_runtime = self._taken("runtime", RUNTIME_FIELDS,
                                                 bound["runtime"])
    taken.update(taken_runtime)
    lines: List[str] = []
    trainer_changes.update(self._ema(config, bound["ema"], lines))
    trainer_changes.update(self._best_checkpoint(
        config, bound["best_checkpoint"], lines))
    try:
      config = _built(config_lib.TrainerConfig, config, trainer_changes)
      runtime = _built(runtime_lib.RuntimeConfig, runtime, runtime_changes)
    except errors.ConfigError as e:
      named = [f"`{setting}` from the experiment's `{field}`"
               for setting, field in taken.items()
               if f"`{setting}`" in str(e)]
      # Its first line: gin adds the configurable's call to the message.
      raise errors.ConfigError(
          str(e).splitlines()[0] +
          (f" ({'; '.join(named)})" if named else "")) from e
    _refuse_unused_bindings(config)
    console.info(f"model garden | {self.describe()}")
    lines = (self._disagreements("trainer", config, TRAINER_FIELDS,
                                 bound["trainer"]) +
             self._disagreements("runtime", runtime, RUNTIME_FIELDS,
                                 bound["runtime"]) +
             lines + self._not_used(runtime))
    for line in lines:
      console.info(line)
    self.write(runtime, config)
    self._settled = (runtime, config)
    return runtime, config

  def _taken(self, prefix: str, fields: Dict[str, str], bound: set
             ) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The experiment's values of the shared `fields` the user did not set,
    by field name; and `{"prefix.name": the experiment's field}` for each."""
    changes, taken = {}, {}
    for name, field in fields.items():
      if name in bound or not _is_set(self.params, field):
        continue
      changes[name] = _ours_value(prefix, name, get_field(self.params, field))
      taken[f"{prefix}.{name}"] = field
    return changes, taken

  def _disagreements(self, prefix: str, built, fields: Dict[str, str],
                     bound: set) -> List[str]:
    """A line for each shared field the user set to another value than the
    experiment's."""
    lines = []
    for name, field in fields.items():
      if name not in bound or not _is_set(self.params, field):
        continue
      theirs = _ours_value(prefix, name, get_field(self.params, field))
      if not _same(getattr(built, name), theirs):
        lines.append(_line(f"{prefix}.{name}", getattr(built, name), field,
                           theirs))
    return lines

  def _ema(self, config: Optional[config_lib.TrainerConfig], bound: set,
           lines: List[str]) -> Dict[str, Any]:
    """The experiment's `trainer.optimizer_config.ema` as `ema.*` (which
    runs Model Garden's EMA optimizer, and evaluates and exports the
    averaged weights), unless gin binds `ema.*`; it is taken out of the
    optimizer config either way."""
    theirs = get_field(self.params, "trainer.optimizer_config.ema")
    if theirs is None:
      return {}
    self.params.trainer.optimizer_config.ema = None
    averaged = dict(decay=theirs.average_decay, start_step=theirs.start_step,
                    dynamic_decay=theirs.dynamic_decay,
                    trainable_weights_only=theirs.trainable_weights_only)
    if bound:
      decay = (config.ema.decay if config is not None
               else ema_lib.EmaConfig().decay)
      if decay != theirs.average_decay:
        lines.append(_line("ema.decay", decay,
                           "trainer.optimizer_config.ema.average_decay",
                           theirs.average_decay))
      return {}
    return {"ema": _built(ema_lib.EmaConfig, config and config.ema,
                          averaged)}

  def _best_checkpoint(self, config: Optional[config_lib.TrainerConfig],
                       bound: set, lines: List[str]) -> Dict[str, Any]:
    """The experiment's best checkpoint (`best_checkpoint_export_subdir`
    and `best_checkpoint_eval_metric` both set) as `best_checkpoint.*`,
    kept in model_dir/best; unless gin binds `best_checkpoint.*`."""
    trainer = self.params.trainer
    metric = getattr(trainer, "best_checkpoint_eval_metric", "")
    if not (metric and getattr(trainer, "best_checkpoint_export_subdir", "")):
      return {}
    metric = "loss" if metric == "validation_loss" else metric
    chosen = dict(metric=metric, higher_is_better=(
        trainer.best_checkpoint_metric_comp == "higher"))
    if bound:
      ours = (config.best_checkpoint.metric if config is not None
              else actions.BestCheckpointConfig().metric)
      if ours != metric:
        lines.append(_line("best_checkpoint.metric", ours,
                           "trainer.best_checkpoint_eval_metric", metric))
      return {}
    return {"best_checkpoint": _built(
        actions.BestCheckpointConfig, config and config.best_checkpoint,
        chosen)}

  def _not_used(self, runtime: runtime_lib.RuntimeConfig) -> List[str]:
    """A line for each experiment field set (other than Model Garden's
    default) that is not used: placement, and fields nothing here reads."""
    config_definitions = _official("official.core.config_definitions")
    lines = []
    default = config_definitions.ExperimentConfig()
    for name in PLACEMENT_FIELDS:
      field = f"runtime.{name}"
      theirs = get_field(self.params, field)
      if _same(theirs, get_field(default, field)) or _same(
          theirs, getattr(runtime, name)):
        continue
      lines.append(
          f"config | the experiment's `{field}` ({theirs!r}) is not used: "
          f"`runtime.{name}` ({getattr(runtime, name)!r}) places the run, "
          "as for every Task (gin/runtime/*.gin)")
    for field, instead in UNSUPPORTED_FIELDS.items():
      theirs = get_field(self.params, field)
      if theirs is None or _same(theirs, get_field(default, field)):
        continue
      lines.append(f"config | the experiment's `{field}` ({theirs!r}) is "
                   f"not used here: {instead}")
    return lines

  def write(self, runtime: runtime_lib.RuntimeConfig,
            config: config_lib.TrainerConfig) -> None:
    """Writes the run's values of the shared settings into `params`."""
    values = {field: getattr(config, name)
              for name, field in TRAINER_FIELDS.items()
              if not (name == "validation_steps" and
                      isinstance(config.validation_steps, dict))}
    values.update({field: _garden_value(name, getattr(runtime, name))
                   for name, field in RUNTIME_FIELDS.items()})
    nested: Dict[str, Any] = {}
    for field, value in values.items():
      if get_field(self.params, field.rsplit(".", 1)[0]) is None:
        continue  # A task config without `train_data`, say.
      *parents, leaf = field.split(".")
      branch = nested
      for parent in parents:
        branch = branch.setdefault(parent, {})
      branch[leaf] = (int(value) if field ==
                      "trainer.continuous_eval_timeout" else value)
    self.params.override(nested, is_strict=True)


def _ours_value(prefix: str, name: str, value):
  """The experiment's value as our setting holds it."""
  if prefix == "runtime" and name == "loss_scale":
    return "dynamic" if value in (None, "", "dynamic") else float(value)
  if prefix == "runtime" and name == "dataset_num_private_threads":
    return int(value or 0)
  return value


def _garden_value(name: str, value):
  """Our runtime setting as the experiment holds it."""
  if name == "loss_scale" and value != "dynamic":
    return float(value)
  return value


def _refuse_unused_bindings(config: config_lib.TrainerConfig) -> None:
  """Refuses gin settings a Model Garden Task cannot use (they would be
  ignored without a word).

  Raises:
    errors.ConfigError: Naming the binding and the experiment's field that
      does its work.
  """
  for configurable in ("optimizer", "learning_rate"):
    bound = sorted(_bound(configurable))
    if bound:
      raise errors.ConfigError(
          f"`{configurable}.{bound[0]}` does not apply to a Model Garden "
          "Task: its optimizer is the experiment's "
          "`trainer.optimizer_config` (set it in "
          f"`{NAME}.params_override`).")
  if config.optimizer_parts:
    raise errors.ConfigError(
        "`trainer.optimizer_parts` does not apply to a Model Garden Task: "
        "its `create_optimizer` builds one optimizer from "
        "`trainer.optimizer_config`.")
  for name, instead in (
      ("gradient_clip_norm",
       "`trainer.optimizer_config.optimizer.<type>.global_clipnorm`"),
      ("gradient_clip_value",
       "`trainer.optimizer_config.optimizer.<type>.clipvalue`"),
      ("gradient_accumulation_steps", None)):
    value = getattr(config, name)
    if value is None or (name == "gradient_accumulation_steps" and
                         value == 1):
      continue
    what = (f"clip in the experiment instead: {instead}" if instead else
            "it needs the framework's own step")
    raise errors.ConfigError(
        f"`trainer.{name}` ({value!r}) does not apply to a Model Garden "
        f"Task, which runs its own `train_step`: {what}.")


def _is_pair(element_spec) -> bool:
  return isinstance(element_spec, tuple) and len(element_spec) == 2


def _one_tuple(*parts):
  """A Model Garden element that is no `(features, labels)` pair, as a
  1-tuple (the framework reads the features as the element's first
  item)."""
  return (parts[0] if len(parts) == 1 else parts,)


@graph_code.written_for_graphs
def _unwrapped(inputs):
  """The Task's element as its reader made it (see `_one_tuple`)."""
  if isinstance(inputs, tuple) and len(inputs) == 1:
    return inputs[0]
  return inputs


@graph_code.written_for_graphs
def _loss(garden: base_task.Task, logs, hook: str):
  """The loss in a step's logs.

  Raises:
    errors.ConfigError: If there is none.
  """
  if not isinstance(logs, dict) or garden.loss not in logs:
    raise errors.ConfigError(
        f"{type(garden).__name__}.{hook} must return a dict with "
        f"`{garden.loss}` (its Task's `loss` key).")
  return logs[garden.loss]


def settle(task: task_lib.Task,
           runtime: Optional[runtime_lib.RuntimeConfig] = None,
           config: Optional[config_lib.TrainerConfig] = None,
           model_dir: Optional[str] = None
           ) -> Tuple[runtime_lib.RuntimeConfig, config_lib.TrainerConfig]:
  """The settings a run of `task` uses.

  For any Task but a `ModelGardenTask`: as given (built from gin where
  None). A `ModelGardenTask`'s are merged with its experiment's the first
  time (`ModelGardenTask.settle`; `gin_config.load_config` builds them so);
  later, they are used as given and written into its experiment config (a
  dry run's or a tool's own step counts).

  Args:
    task: The Task.
    runtime: The runtime settings; None builds them from gin.
    config: The trainer settings; None builds them from gin.
    model_dir: The run's directory: the Model Garden Task's `logging_dir`.
  """
  if not isinstance(task, ModelGardenTask):
    return (runtime or runtime_lib.RuntimeConfig(),
            config or config_lib.TrainerConfig())
  if model_dir is not None and task.logging_dir is None:
    task.logging_dir = model_dir
  if not task.settled:
    return task.settle(runtime, config)
  runtime = runtime or runtime_lib.RuntimeConfig()
  config = config or config_lib.TrainerConfig()
  task.write(runtime, config)
  return runtime, config
