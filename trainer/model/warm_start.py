"""Warm start: initialise a new run's model, or parts of it, from a checkpoint.

Bound as `warm_start.<name>` and applied by `Task.initialize`, which the
framework calls only when `model_dir` has no checkpoint yet (a restarted run
resumes from its own checkpoint instead). Sub-modules are matched the way
TensorFlow 2 checkpoints are organised, by their path in the object graph
(attribute names, and the `layer_with_weights-N` slots of functional and
Sequential models), as Model Garden's `init_checkpoint_modules` does.
"""

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf
import tf_keras

from trainer import checks
from trainer import console
from trainer import errors
from trainer.storage import checkpoints
from trainer.storage import files

_VARIABLE = re.compile(r"<tf\.Variable '([^']+?)(?::\d+)?' shape=(\([^)]*\))")


@gin.configurable("warm_start")
@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  """Where a new run's weights come from, bound as `warm_start.<name>`.

  Attributes:
    checkpoint: A checkpoint prefix (`.../ckpt-1000`) or a directory (its
      newest checkpoint); None starts from the model's initialisers.
    modules: What to take from it: empty for the whole model, or sub-modules
      by attribute path (`backbone`, `backbone.stem`) or layer name; the
      other weights keep their initial values.
    checkpoint_key: The model's path in the checkpoint: `model` in this
      framework's and Model Garden's checkpoints, `model/<name>` for one of
      several there (a GAN run's `model/classifier`), '' in one written by
      `model.save_weights`. Left at `model` with `model` set, a checkpoint
      holding several models, one of them named `model`, is read at
      `model/<model>`.
    model: With several models (`trainer.model.named`), the one initialised (a
      distillation's teacher from its own run, say), or a list of them, each
      read at `model/<name>` of a checkpoint of several models (the models
      a run held before one was added).
  """
  checkpoint: Optional[str] = None
  modules: Sequence[str] = ()
  checkpoint_key: str = "model"
  model: Union[None, str, Sequence[str]] = None

  def __post_init__(self):
    object.__setattr__(self, "modules", tuple(self.modules))
    checks.require(not self.modules or self.checkpoint is not None,
                   "`warm_start.modules` needs `warm_start.checkpoint`.")
    if self.model is not None and not isinstance(self.model, str):
      names = (tuple(self.model)
               if isinstance(self.model, (list, tuple)) else ())
      checks.require(
          bool(names) and all(isinstance(name, str) for name in names),
          f"`warm_start.model` ({self.model!r}) must be a model's name or a "
          "list of them.")
      checks.require(
          len(names) == 1 or self.checkpoint_key == "model",
          f"`warm_start.checkpoint_key` ({self.checkpoint_key!r}) is one "
          f"model's place in the checkpoint, but `warm_start.model` names "
          f"{len(names)}: leave the key at 'model', where each is read at "
          "`model/<name>`.")
      object.__setattr__(self, "model", names[0] if len(names) == 1 else names)

  @property
  def models(self) -> Tuple[Optional[str], ...]:
    """The models initialised: `(None,)` where the Task builds one."""
    if self.model is None or isinstance(self.model, str):
      return (self.model,)
    return tuple(self.model)


def resolve_checkpoint(path: str) -> str:
  """Returns the checkpoint prefix `path` names (a directory: its newest).

  Raises:
    errors.ConfigError: If there is no checkpoint there.
  """
  prefix = tf.train.latest_checkpoint(path) if files.isdir(path) else path
  if prefix is None or not files.exists(prefix + ".index"):
    raise errors.ConfigError(
        f"`warm_start.checkpoint` ({path}) names no checkpoint.")
  return prefix


def _children(obj) -> Dict[str, object]:
  return tf.train.TrackableView(obj).children(obj)


def _find(model: tf_keras.Model, module: str) -> Tuple[List[str], object]:
  """Returns the object-graph path (dependency names) of `module`.

  Each dot-separated part is an attribute (a dependency name) or the name of
  a layer among the children.
  """
  obj, path = model, []
  for part in module.split("."):
    children = _children(obj)
    if part in children:
      key = part
    else:
      keys = [key for key, child in children.items()
              if getattr(child, "name", None) == part]
      if not keys:
        names = sorted({getattr(child, "name", key)
                        for key, child in children.items()
                        if isinstance(child, tf_keras.layers.Layer) and
                        child.weights})
        raise errors.ConfigError(
            f"`warm_start.modules`: {module!r} names nothing in the model "
            f"(at {part!r}; layers with weights there: "
            f"{', '.join(names) or 'none'}).")
      key = keys[0]
    obj = children[key]
    path.append(key)
  return path, obj


def _partial_graph(model: tf_keras.Model, modules: Sequence[str]):
  """Returns a trackable holding only `modules`, at their usual paths."""
  if not modules:
    return model
  tree = {}
  for module in modules:
    path, obj = _find(model, module)
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = obj

  def build(node):
    return tf.train.Checkpoint(**{
        key: build(value) if isinstance(value, dict) else value
        for key, value in node.items()})

  return build(tree)


def _source_key(config: WarmStartConfig, prefix: str) -> str:
  """Where the initialised model is in the checkpoint: `checkpoint_key`,
  or `model/<config.model>` in a checkpoint of several models with one of
  that name, where the key is left at `model`."""
  if (config.model and config.checkpoint_key == "model"
      and config.model in checkpoints.children_at(prefix, "model")):
    return f"model/{config.model}"
  return config.checkpoint_key


def _several_models_hint(config: WarmStartConfig, root, key: str,
                         prefix: str) -> str:
  """Where `key` holds several models (a GAN run's), says which, and where
  `root`'s variables are among them by name, how to pick it; else ''."""
  children = checkpoints.children_at(prefix, key)
  if not children or _holds_layers(prefix, key):
    return ""  # Nothing there, or one Keras model's layers.
  whom = f"model '{config.model}'" if config.model else "this model"
  several = f"`{key}` there holds several models ({', '.join(children)})"
  found = checkpoints.key_holding(root, prefix, key)
  if found is not None:
    return (f"; {several}, and the variables of {whom} are at `{found}`: "
            f"set `warm_start.checkpoint_key` to '{found}'")
  # Without a model named, only Keras models by name (a subclassed model's
  # attributes are no models to choose from).
  if config.model or all(_holds_layers(prefix, f"{key}/{child}")
                         for child in children):
    return (f"; {several}: set `warm_start.checkpoint_key` to "
            f"'{key}/<name>' of the one {whom} starts from")
  return ""


def _holds_layers(prefix: str, key: str) -> bool:
  """Whether `key` in checkpoint `prefix` holds a Keras model's layers."""
  return any(re.fullmatch(r"layer(_with_weights)?-\d+", child)
             for child in checkpoints.children_at(prefix, key))


# Variables of each side a different model's line lists.
_LISTED = 3


def _shape(shape) -> str:
  return str(tuple(shape))


def _different_model(root, key: str, prefix: str, whole: bool,
                     whom: str) -> Optional[str]:
  """Says that `key` in checkpoint `prefix` holds another model than
  `root`'s, listing a few variables of each, when their variables and
  shapes do not line up (positional keys: a shape mismatch there compares
  two models' unrelated layers); None when only shapes differ.

  Args:
    whole: Whether `root` is a whole model (else some of its modules, and
      the checkpoint may hold more).
  """
  ours = {path: variable
          for path, variable in checkpoints.keyed_variables(root).items()
          if path.startswith(f"{key}/" if key else "")}
  start = len(key) + 1 if key else 0
  theirs = {name[:-len(checkpoints.VALUE)]: shape
            for name, shape in tf.train.list_variables(prefix)
            if name.startswith(f"{key}/" if key else "") and
            name.endswith(checkpoints.VALUE) and
            "/.OPTIMIZER_SLOT/" not in name and
            # What `model.save_weights` keeps beside the model, at ''.
            (key or name.split("/")[0] not in ("optimizer", "save_counter"))}
  if set(ours) == set(theirs) or (not whole and set(ours) <= set(theirs)):
    return None

  def listed(items):
    more = ", ..." if len(items) > _LISTED else ""
    return ", ".join(items[:_LISTED]) + more

  there = [f"{name[start:]} {_shape(shape)}" for name, shape in theirs.items()]
  here = [f"{variable.name.split(':')[0]} {_shape(variable.shape)}"
          for variable in ours.values()]
  where = f"`{key}` there" if key else "its root"  # '': save_weights'.
  return (f"{where} holds a different model than {whom}: their "
          f"variables and shapes do not line up (the checkpoint's "
          f"{len(there)}: {listed(there)}; this model's {len(here)}: "
          f"{listed(here)})")


def _unmatched_variables(error: AssertionError) -> List[str]:
  return sorted(f"{name} {shape}"
                for name, shape in _VARIABLE.findall(str(error)))


def restore(model: tf_keras.Model, config: WarmStartConfig) -> Optional[str]:
  """Loads `config.modules` of `model` (all of it if none) from a checkpoint.

  Returns:
    The checkpoint prefix read, or None when no warm start is configured.

  Raises:
    errors.ConfigError: If the checkpoint is missing, a module is not in the
      model, a variable has no value or another shape in the checkpoint
      (each is named), or the checkpoint holds a different model (a few
      variables of each are listed).
  """
  if config.checkpoint is None:
    return None
  prefix = resolve_checkpoint(config.checkpoint)
  key = _source_key(config, prefix)
  root = _partial_graph(model, config.modules)
  if root is model and not key:
    # `model.save_weights`' checkpoint: the model is its root. A Keras
    # model cannot read a checkpoint; a `tf.train.Checkpoint` holding its
    # children (its layers, by their keys) reads them where it wrote them.
    root = tf.train.Checkpoint(**_children(model))
  for name in reversed(key.split("/") if key else []):
    root = tf.train.Checkpoint(**{name: root})
  what = ", ".join(config.modules) or "the whole model"
  if config.model:
    what = f"model '{config.model}': {what}"
  try:
    status = root.read(prefix)
    status.expect_partial()  # The optimizer and the rest are not wanted.
    status.assert_existing_objects_matched()
  except AssertionError as e:
    missing = _unmatched_variables(e)
    raise errors.ConfigError(
        f"warm start from {prefix}: {len(missing)} variable(s) of {what} "
        f"have no value {f'under `{key}` there' if key else 'at its root'}"
        f": {', '.join(missing[:5])}"
        f"{', ...' if len(missing) > 5 else ''}"
        f"{_several_models_hint(config, root, key, prefix)}.") from e
  except ValueError as e:
    mismatch = checkpoints.shape_mismatch(e)
    if not mismatch:
      raise
    # The shape of a variable the checkpoint has under another name is
    # another model's: said only where it has it under this one.
    absent = checkpoints.not_held(root, prefix, key)
    mismatch = _different_model(
        root, key, prefix, not config.modules,
        f"model '{config.model}'" if config.model else "this one") or (
            f"the checkpoint {absent}" if absent else mismatch)
    raise errors.ConfigError(
        f"warm start from {prefix}: {mismatch}.") from e
  source = ("" if key == "model" else f" (`{key}`)" if key else
            " (its root)")
  console.info(f"warm start | {what} from {prefix}{source}")
  return prefix
