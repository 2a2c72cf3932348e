"""A loss and metrics given as `model.compile(loss=..., metrics=...)` takes
them: by Keras name, as tf_keras objects or classes, or as functions.

Names are looked up in `tf_keras.losses` and `tf_keras.metrics` without
building anything (a metric makes variables, which would start
TensorFlow's devices before the run sets them up), so an unknown name is a
one-line error before TensorFlow starts. `"accuracy"` and `"crossentropy"`
are chosen by the shapes of labels and outputs, as `compile` chooses them.
"""

import copy
import difflib
import functools
import inspect
from typing import Any, Callable, List, Sequence

import tensorflow as tf
import tf_keras
# What `compile` wraps a loss function in; not exported by tf_keras.
from tf_keras.src.losses import LossFunctionWrapper

from tasks import keras_versions
from trainer import errors
from trainer import graph_code

# What `compile` picks by the shapes of labels and outputs.
_BY_SHAPE = {"accuracy": "accuracy", "acc": "accuracy",
             "crossentropy": "crossentropy", "ce": "crossentropy"}


def _public(module) -> List[str]:
  return [name for name in dir(module) if not name.startswith("_") and
          name not in ("deserialize", "serialize", "get", "experimental",
                       "Loss", "Metric", "Reduction", "MeanMetricWrapper")]


def _by_name(setting: str, name: str, module, kind: str) -> Any:
  """The class or function `module` holds under `name` (exactly, or a class
  by its name in any case: "auc" is `AUC`, as `compile` takes it).

  Raises:
    errors.ConfigError: For a name Keras does not know, with the closest.
  """
  names = _public(module)
  if name in names:
    return getattr(module, name)
  folded = {n.lower(): n for n in names if n[:1].isupper()}
  if name.lower() in folded:
    return getattr(module, folded[name.lower()])
  close = difflib.get_close_matches(name, names + list(_BY_SHAPE), n=1)
  hint = f" (did you mean '{close[0]}'?)" if close else ""
  raise errors.ConfigError(
      f"`{setting}` ({name!r}) is no Keras {kind}{hint}: name one of "
      f"`tf_keras.{module.__name__.rsplit('.', 1)[-1]}` or give a tf_keras "
      "object.")


def _takes(function: Callable, argument: str) -> bool:
  try:
    return argument in inspect.signature(function).parameters
  except (TypeError, ValueError):
    return False


def loss(setting: str, value: Any, from_logits=None) -> tf_keras.losses.Loss:
  """Returns the loss as a tf_keras `Loss` giving per-example losses
  (reduction NONE: the framework averages them over the global batch).

  Args:
    setting: How the loss is called in errors (`KerasModelTask.loss`).
    value: A name (`"sparse_categorical_crossentropy"`, `"mse"`,
      `"Huber"`), a tf_keras `Loss` object or class, or a function
      `(y_true, y_pred) -> losses`.
    from_logits: For a name or class: whether the outputs are logits; None
      keeps Keras's default (False). With an object, set it there.

  Raises:
    errors.ConfigError: For no loss, an unknown name, a Keras 3 loss, or a
      `from_logits` the loss does not take.
  """
  if value is None:
    raise errors.ConfigError(
        f"`{setting}` is not set: name a Keras loss (e.g. "
        "\"sparse_categorical_crossentropy\") or give a tf_keras loss.")
  keras_versions.refuse_keras3(setting, value)
  if isinstance(value, str):
    value = _by_name(setting, value, tf_keras.losses, "loss")
  if isinstance(value, tf_keras.losses.Loss):
    if from_logits is not None:
      raise errors.ConfigError(
          f"`{setting.rsplit('.', 1)[0]}.from_logits` applies to a loss "
          f"given by name or class; {type(value).__name__} is an object: "
          "set `from_logits` on it.")
    per_example = copy.copy(value)
    per_example.reduction = tf_keras.losses.Reduction.NONE
    return per_example
  options = {}
  if from_logits is not None:
    target = value.__init__ if inspect.isclass(value) else value
    if not _takes(target, "from_logits"):
      raise errors.ConfigError(
          f"`{setting.rsplit('.', 1)[0]}.from_logits` does not apply to "
          f"the loss {getattr(value, '__name__', value)!r}, which takes no "
          "logits.")
    options["from_logits"] = from_logits
  if inspect.isclass(value) and issubclass(value, tf_keras.losses.Loss):
    return value(reduction=tf_keras.losses.Reduction.NONE, **options)
  if not callable(value):
    raise errors.ConfigTypeError(
        f"`{setting}` ({value!r}) must be a loss name, a tf_keras loss or a "
        "function (y_true, y_pred) -> losses.")
  return LossFunctionWrapper(
      value, reduction=tf_keras.losses.Reduction.NONE,
      name=getattr(value, "__name__", "loss"), **options)


def metrics(setting: str, values: Sequence[Any]
            ) -> List[Callable[[], tf_keras.metrics.Metric]]:
  """Returns one factory per metric: each call builds it anew (once for
  training, once per evaluation set, inside the strategy's scope).

  Args:
    setting: How the metrics are called in errors.
    values: Each a name (`"accuracy"`, `"mae"`, `"AUC"`), a tf_keras
      `Metric` object (copied from its config) or class, or a function
      `(y_true, y_pred) -> values` (averaged, named after the function).

  Raises:
    errors.ConfigError: For an unknown name, a Keras 3 metric, or anything
      else.
  """
  if isinstance(values, (str, tf_keras.metrics.Metric)) or not isinstance(
      values, (list, tuple)):
    values = [values]
  return [_metric(f"{setting}[{i}]", value) for i, value in enumerate(values)]


def _metric(setting: str, value: Any) -> Callable[[], tf_keras.metrics.Metric]:
  keras_versions.refuse_keras3(setting.split("[")[0], value)
  if isinstance(value, str):
    if value.lower() in _BY_SHAPE:
      return functools.partial(tf_keras.metrics.MeanMetricWrapper,
                               _by_shape(_BY_SHAPE[value.lower()]),
                               name=value)
    name, value = value, _by_name(setting, value, tf_keras.metrics, "metric")
    if not inspect.isclass(value):
      return functools.partial(tf_keras.metrics.MeanMetricWrapper, value,
                               name=name)
  if isinstance(value, tf_keras.metrics.Metric):
    return functools.partial(type(value).from_config, value.get_config())
  if inspect.isclass(value) and issubclass(value, tf_keras.metrics.Metric):
    return value
  if callable(value) and not inspect.isclass(value):
    return functools.partial(tf_keras.metrics.MeanMetricWrapper, value,
                             name=getattr(value, "__name__", "metric"))
  raise errors.ConfigTypeError(
      f"`{setting}` ({value!r}) must be a metric name, a tf_keras metric or "
      "a function (y_true, y_pred) -> values.")


def _by_shape(kind: str) -> Callable:
  """The accuracy or crossentropy `compile` picks for these shapes:
  binary for one output, sparse categorical for labels of lower rank (or a
  last axis of 1 against several outputs), categorical otherwise."""

  @graph_code.written_for_graphs
  def chosen(y_true, y_pred):
    binary = y_pred.shape[-1] == 1
    sparse = (y_true.shape.rank < y_pred.shape.rank or
              (y_true.shape[-1] == 1 and y_pred.shape[-1] != 1))
    if kind == "accuracy":
      function = (tf_keras.metrics.binary_accuracy if binary else
                  tf_keras.metrics.sparse_categorical_accuracy if sparse else
                  tf_keras.metrics.categorical_accuracy)
    else:
      function = (tf_keras.metrics.binary_crossentropy if binary else
                  tf_keras.metrics.sparse_categorical_crossentropy if sparse
                  else tf_keras.metrics.categorical_crossentropy)
    return function(y_true, y_pred)

  chosen.__name__ = kind
  return chosen


@graph_code.written_for_graphs
def matched(labels, outputs, sample_weight=None):
  """Labels, outputs and sample weights as `compile`'s containers give them
  to losses and metrics (tf_keras's `match_dtype_and_rank`): labels and
  weights of rank 1 against outputs of rank 2 get a last axis; labels of
  the outputs' kind (both floating, or both integer) and the weights take
  the outputs' type."""
  if not (tf.is_tensor(labels) and tf.is_tensor(outputs)):
    return labels, outputs, sample_weight
  if labels.shape.rank == 1 and outputs.shape.rank == 2:
    labels = tf.expand_dims(labels, -1)
  if (labels.dtype.is_floating and outputs.dtype.is_floating) or (
      labels.dtype.is_integer and outputs.dtype.is_integer):
    labels = tf.cast(labels, outputs.dtype)
  if sample_weight is not None:
    if sample_weight.shape.rank == 1 and outputs.shape.rank == 2:
      sample_weight = tf.expand_dims(sample_weight, -1)
    sample_weight = tf.cast(sample_weight, outputs.dtype)
  return labels, outputs, sample_weight
