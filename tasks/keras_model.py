"""`KerasModelTask`: a Keras model trained without a Task to write.

What `model.compile(...)` and `model.fit(...)` are given is bound in gin:

- the model, from a function returning a tf_keras model (`model`) or a file
  (`model_file`: `.keras`, `.h5` or a SavedModel directory, loaded with
  tf_keras);
- the data, from functions returning `tf.data.Dataset`s of single `(x, y)`
  (or `(x, y, sample_weight)`) examples (`train_data`, `eval_data`, which
  may be a dict of named evaluation sets), or a tfds dataset by name and
  split (`tfds_name`);
- the loss and metrics by Keras name or object (`loss`, `metrics`,
  `from_logits`), as `compile` takes them (`tasks.keras_compile`).

The optimizer is the framework's (`optimizer.*`, `learning_rate.*`), the
batch sizes and steps `trainer.*`. Keras 3 models and files are refused in
one line naming what works (`tasks.keras_versions`).
"""

import collections
import zipfile
import zlib
from typing import Any, Callable, Dict, Optional, Sequence, Union

import gin
import tensorflow as tf
import tf_keras

import trainer
from tasks import data_functions
from tasks import keras_compile
from tasks import keras_versions
from tasks import tfds_inputs
from trainer import errors
from trainer import graph_code
from trainer.data import inputs
from trainer.storage import files

NAME = "KerasModelTask"
# Labels with their sample weights: what an `(x, y, w)` example's label
# becomes (tf.data keeps namedtuples), so the loss and metrics weigh it.
Weighted = collections.namedtuple("Weighted", ["labels", "sample_weight"])
DataFn = Callable[..., tf.data.Dataset]
# What reading a damaged `.keras` file (a zip archive) raises: a checksum
# that does not match, a broken archive, compressed bytes that do not
# inflate. None of them is a model tf_keras cannot read, so none is said as
# one.
_DAMAGED = (zipfile.BadZipFile, zlib.error)


@gin.configurable
class KerasModelTask(trainer.Task):
  """Trains a Keras model on `(x, y)` examples with a Keras loss, as `fit`."""

  def __init__(self, model: Optional[Callable[[], tf_keras.Model]] = None,
               model_file: Optional[str] = None,
               loss: Any = None,
               from_logits: Optional[bool] = None,
               metrics: Sequence[Any] = (),
               weighted_metrics: Sequence[Any] = (),
               train_data: Optional[DataFn] = None,
               eval_data: Union[DataFn, Dict[str, DataFn], None] = None,
               tfds_name: Optional[str] = None,
               train_split: str = "train",
               eval_split: Union[str, Dict[str, str], None] = "test",
               data_dir: Optional[str] = None,
               shuffle_buffer: int = 0,
               shuffle_seed: int = 0,
               initial_weights: Optional[str] = None):
    """Configures the model, its data, loss and metrics.

    Args:
      model: A function returning the tf_keras model (gin: `@my_model`,
        without parentheses: it is called inside the strategy's scope).
      model_file: Or a model saved by tf_keras: a `.keras` file, an `.h5`
        file or a SavedModel directory (only the model is read, not its
        compile settings).
      loss: A Keras loss name (`"sparse_categorical_crossentropy"`,
        `"mse"`, `"Huber"`), a tf_keras `Loss` object or class, or a
        function `(y_true, y_pred) -> per-example losses`.
      from_logits: Whether the model's outputs are logits, for a loss given
        by name or class; None keeps Keras's default (False).
      metrics: Keras metric names (`"accuracy"`, chosen by the shapes as
        `compile` does; `"mae"`, `"AUC"`), tf_keras `Metric`s or metric
        functions; as in `compile`, they ignore sample weights.
      weighted_metrics: The same, weighted by the examples' sample weights
        (named `weighted_<name>` where a metric has the name).
      train_data: A function returning the training `tf.data.Dataset` of
        single `(x, y)` or `(x, y, sample_weight)` examples, unbatched (the
        framework batches by `trainer.global_batch_size` and repeats it);
        it may take the `tf.distribute.InputContext` to shard by itself,
        in a parameter named `input_context` or annotated with the type
        (other parameters, `training`, are gin's: `@train/my_data`).
      eval_data: The same for evaluation (read once per evaluation, partial
        last batch kept), or a dict of them by set name
        (`{"clean": @clean_data, "noisy": @noisy_data}`).
      tfds_name: Or read a tensorflow-datasets dataset, prepared beforehand
        in `data_dir`, as `(image, label)` pairs.
      train_split: The tfds training split.
      eval_split: The tfds evaluation split, or a dict of them by set name;
        None for no evaluation.
      data_dir: Where tfds keeps the dataset; None is tfds's default.
      shuffle_buffer: Shuffle the training examples through a buffer of this
        many, anew every epoch (seeded by `shuffle_seed`; the buffer is in
        every checkpoint); 0 keeps the data's own order, as `fit` does with
        a dataset.
      shuffle_seed: Seeds the shuffle (and tfds's file order).
      initial_weights: A new run starts from these weights: a file tf_keras
        reads weights from (`.h5`, `.keras`, `.weights.h5`, a TensorFlow
        checkpoint), or a `.keras` or `.h5` file saved by Keras 3, read by
        Keras 3 and copied weight by weight in order into the same
        architecture built with tf_keras. Then `warm_start.*` applies.
    """
    self.model = model
    self.model_file = model_file
    self.loss = keras_compile.loss(f"{NAME}.loss", loss, from_logits)
    self.metric_factories = keras_compile.metrics(f"{NAME}.metrics", metrics)
    self.weighted_factories = keras_compile.metrics(
        f"{NAME}.weighted_metrics", weighted_metrics)
    self.train_data = train_data
    self.eval_data = eval_data
    self.tfds_name = tfds_name
    self.train_split = train_split
    self.eval_split = eval_split
    self.data_dir = data_dir
    self.shuffle_buffer = shuffle_buffer
    self.shuffle_seed = shuffle_seed
    self.initial_weights = initial_weights
    self._check_model()
    self._check_data()
    if initial_weights is not None and not files.exists(initial_weights):
      raise errors.ConfigError(
          f"`{NAME}.initial_weights` ({initial_weights}) does not exist.")

  def _check_model(self) -> None:
    if (self.model is None) == (self.model_file is None):
      raise errors.ConfigError(
          f"set one of `{NAME}.model` (a function returning the model) and "
          f"`{NAME}.model_file` (a saved model), not "
          f"{'both' if self.model is not None else 'neither'}.")
    if self.model_file is not None:
      keras_versions.check_model_file(f"{NAME}.model_file", self.model_file)
      return
    keras_versions.refuse_keras3(f"{NAME}.model", self.model)
    if isinstance(self.model, (tf_keras.Model, tf.Module)) or not callable(
        self.model):
      raise errors.ConfigTypeError(
          f"`{NAME}.model` is a {type(self.model).__name__}, not a function: "
          "pass the function that builds the model (gin: `@my_model`, "
          "without parentheses), which the run calls inside the strategy's "
          "scope.")

  def _check_data(self) -> None:
    functions = {"train_data": self.train_data, "eval_data": self.eval_data}
    if self.tfds_name is not None:
      given = [name for name, value in functions.items() if value is not None]
      if given:
        raise errors.ConfigError(
            f"set `{NAME}.tfds_name` or `{NAME}.{given[0]}`, not both.")
      return
    if self.train_data is None:
      raise errors.ConfigError(
          f"`{NAME}.train_data` is not set: bind a function returning a "
          f"tf.data.Dataset of (x, y) examples, or `{NAME}.tfds_name`.")
    eval_data = self.eval_data
    for name, value in [("train_data", self.train_data)] + (
        [(f"eval_data[{k!r}]", v) for k, v in eval_data.items()]
        if isinstance(eval_data, dict) else [("eval_data", eval_data)]):
      if value is not None and (isinstance(value, tf.data.Dataset) or
                                not callable(value)):
        raise errors.ConfigTypeError(
            f"`{NAME}.{name}` is a {type(value).__name__}, not a function: "
            "pass the function that returns the dataset (gin: `@my_data`, "
            "without parentheses).")

  def build_model(self) -> tf_keras.Model:
    if self.model_file is not None:
      model = _load(self.model_file)
      what = f"`{NAME}.model_file` ({self.model_file})"
    else:
      model = graph_code.user_code(self.model)()
      what = f"`{NAME}.model` ({getattr(self.model, '__name__', 'model')})"
    if keras_versions.is_keras3(model):
      raise errors.ConfigError(
          f"{what} gave a Keras 3 model ({type(model).__module__}."
          f"{type(model).__name__}), which this framework (tf_keras, Keras 2)"
          " cannot train: save it with Keras 3 (`model.save(\"model.keras\")`)"
          f", then {keras_versions.ROUTE.format(file='model.keras')}.")
    if not isinstance(model, tf_keras.Model):
      raise errors.ConfigTypeError(
          f"{what} gave {type(model).__name__}: return a tf_keras.Model.")
    return model

  def build_inputs(self, training: bool,
                   input_context: Optional[tf.distribute.InputContext] = None
                   ) -> Union[tf.data.Dataset, Dict[str, tf.data.Dataset]]:
    if self.tfds_name is not None:
      split = self.train_split if training else self.eval_split
      if split is None:
        raise errors.ConfigError(
            f"`{NAME}.eval_split` is None: this run evaluates; name the "
            "split to evaluate on.")
      if isinstance(split, dict):
        return {name: self._tfds(s, training, input_context)
                for name, s in split.items()}
      return self._tfds(split, training, input_context)
    source = self.train_data if training else self.eval_data
    name = "train_data" if training else "eval_data"
    if source is None:
      raise errors.ConfigError(
          f"`{NAME}.eval_data` is not set, and this run evaluates: bind a "
          "function returning the evaluation dataset (or run "
          "--mode=train).")
    if isinstance(source, dict):
      return {key: self._examples(f"{name}[{key!r}]", fn, False,
                                  input_context)
              for key, fn in source.items()}
    return self._examples(name, source, training, input_context)

  def _tfds(self, split: str, training: bool,
            input_context: Optional[tf.distribute.InputContext]
            ) -> tf.data.Dataset:
    dataset = tfds_inputs.load_shard(
        self.tfds_name, split, data_dir=self.data_dir,
        input_context=input_context, shuffle_files=training,
        shuffle_seed=self.shuffle_seed)
    return self._shuffled(dataset) if training else dataset

  def _examples(self, name: str, function: DataFn, training: bool,
                input_context: Optional[tf.distribute.InputContext]
                ) -> tf.data.Dataset:
    """Calls a data function (with the input context where it has a
    parameter for it, else sharding what it returns) and checks its
    examples."""
    dataset = data_functions.call(f"{NAME}.{name}", function, input_context)
    takes_context = data_functions.context_parameter(function) is not None
    what = f"`{NAME}.{name}` ({getattr(function, '__name__', 'function')})"
    if not isinstance(dataset, tf.data.Dataset):
      raise errors.ConfigTypeError(
          f"{what} returned {type(dataset).__name__}: return a "
          "tf.data.Dataset of (x, y) examples.")
    if (not takes_context and input_context is not None and
        input_context.num_input_pipelines > 1):
      dataset = dataset.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    spec = dataset.element_spec
    try:
      inputs.check_unbatched(spec)
    except errors.ConfigError as e:
      raise errors.ConfigError(
          f"{what} returns batches (every element has a leading dimension "
          "of unknown size): return single examples, without `.batch(...)`; "
          "the framework batches them by `trainer.global_batch_size` and "
          "`trainer.eval_batch_size`.") from e
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
      raise errors.ConfigError(
          f"{what} gives elements of {_structure(spec)}: give (x, y) "
          "examples, or (x, y, sample_weight).")
    if len(spec) == 3:
      dataset = dataset.map(lambda x, y, w: (x, Weighted(y, w)))
    return self._shuffled(dataset) if training else dataset

  def _shuffled(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    if not self.shuffle_buffer:
      return dataset
    return dataset.shuffle(self.shuffle_buffer, seed=self.shuffle_seed,
                           reshuffle_each_iteration=True)

  def build_losses(self, labels, model_outputs, aux_losses=None):
    del aux_losses
    labels, weights = _unweighted(labels)
    labels, model_outputs, weights = keras_compile.matched(
        labels, model_outputs, weights)
    losses = self.loss(labels, model_outputs, sample_weight=weights)
    # Losses of more than one value per example (a sequence's steps) are
    # averaged per example: `fit` averages them over all their values, the
    # same mean over the global batch.
    if losses.shape.rank and losses.shape.rank > 1:
      losses = tf.reduce_mean(losses, axis=list(range(1, losses.shape.rank)))
    return losses

  def build_metrics(self, training: bool = True):
    del training
    metrics = [factory() for factory in self.metric_factories]
    names = {metric.name for metric in metrics}
    for factory in self.weighted_factories:
      metric = factory()
      if metric.name in names:  # As `compile` names it.
        metric._name = f"weighted_{metric.name}"  # pylint: disable=protected-access
      metric.by_sample_weight = True
      metrics.append(metric)
    return metrics

  @graph_code.written_for_graphs
  def process_metrics(self, metrics, labels, model_outputs) -> None:
    labels, weights = _unweighted(labels)
    labels, model_outputs, weights = keras_compile.matched(
        labels, model_outputs, weights)
    for metric in metrics:
      metric.update_state(
          labels, model_outputs,
          sample_weight=(weights if getattr(metric, "by_sample_weight", False)
                         else None))

  def initialize(self, model: tf_keras.Model, warm_start=None) -> None:
    if self.initial_weights is not None:
      _set_weights(model, self.initial_weights)
    super().initialize(model, warm_start)


@graph_code.written_for_graphs
def _unweighted(labels):
  if isinstance(labels, Weighted):
    return labels.labels, labels.sample_weight
  return labels, None


def _structure(spec) -> str:
  if isinstance(spec, tuple):
    return f"a tuple of {len(spec)}"
  if isinstance(spec, dict):
    return f"a dict ({', '.join(map(str, spec))})"
  return "single tensors"


def _load(path: str) -> tf_keras.Model:
  """Loads a model saved by tf_keras (checked by `check_model_file`).

  Raises:
    errors.ConfigError: Where the file is damaged, or holds no model
      tf_keras can load, with tf_keras's reason.
  """
  try:
    model = tf_keras.models.load_model(path, compile=False)
  except _DAMAGED as e:
    raise errors.ConfigError(_damaged(f"{NAME}.model_file", path, e)) from e
  except (ValueError, TypeError, OSError, KeyError, AttributeError,
          tf.errors.OpError) as e:
    raise errors.ConfigError(
        f"`{NAME}.model_file` ({path}) holds no model tf_keras can load: "
        f"{_first_line(e)}") from e
  if not isinstance(model, tf_keras.Model):
    raise errors.ConfigError(
        f"`{NAME}.model_file` ({path}) holds a {type(model).__name__}, no "
        "Keras model.")
  return model


def _first_line(error: BaseException) -> str:
  """An error's first line, or its type's name where it has no message."""
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def _damaged(setting: str, path: str, error: BaseException) -> str:
  return (f"`{setting}` ({path}) is damaged ({_first_line(error)}: its "
          "bytes changed after it was saved): save the model again, or give "
          "an intact copy.")


def _set_weights(model: tf_keras.Model, path: str) -> None:
  """Puts the weights of `path` into `model`: by tf_keras, or, for a file
  saved by Keras 3, by Keras 3's own reading, copied in order.

  Raises:
    errors.ConfigError: Where they do not fit the model, or the file is
      damaged.
  """
  version = keras_versions.saved_by(path)
  try:
    if version and keras_versions.major(version) >= 3:
      import keras  # pylint: disable=g-import-not-at-top
      source = keras.saving.load_model(path, compile=False)
      weights = source.get_weights()
      if len(weights) != len(model.weights):
        raise ValueError(
            f"it holds {len(weights)} weights (Keras {version}), the model "
            f"{len(model.weights)}")
      model.set_weights(weights)
    else:
      model.load_weights(path)
  except _DAMAGED as e:
    raise errors.ConfigError(
        _damaged(f"{NAME}.initial_weights", path, e)) from e
  except (ValueError, TypeError, OSError, KeyError,
          tf.errors.OpError) as e:
    raise errors.ConfigError(
        f"`{NAME}.initial_weights` ({path}) does not fit the model: "
        f"{_first_line(e)}") from e
