"""Checkpoint manager creation, restore with fallback, and cleanup.

`tf.train.CheckpointManager` restores only the newest checkpoint and fails
if it is damaged; measured on this stack, a truncated file raises
`IndexError`, flipped bytes `DataLossError`, a missing data file an
`OpError`. `restore` then falls back to the next newest, leaving the damaged
one on disk for inspection, renamed (the resumed run saves the same step
again): nothing is deleted because a newer one is bad. Damage is found,
and the damaged files set aside, by `checkpoint_verify`.
"""

import collections
import collections.abc
import os
import re
from typing import Callable, Dict, List, Optional, Sequence, Set

import tensorflow as tf
# pylint: disable-next=g-direct-tensorflow-import
from tensorflow.core.protobuf import trackable_object_graph_pb2

from trainer import console
from trainer import errors
from trainer.storage import checkpoint_verify
from trainer.storage import files


class _HoldingManager(tf.train.CheckpointManager):
  """Deletes a checkpoint beyond `max_to_keep` only once it is evaluated.

  `tf.train.CheckpointManager` offers no hook for what to delete; its
  `_sweep` (called by `save`) is replaced here, keeping its contract: the
  newest `max_to_keep` stay, older ones go unless `evaluated_fn` does not
  list their step yet, in which case they stay (and stay in the state file)
  until a later save finds them evaluated.
  """

  def __init__(self, *args, evaluated_fn: Callable[[], Set[int]], **kwargs):
    super().__init__(*args, **kwargs)
    self._evaluated_fn = evaluated_fn

  def _sweep(self):
    if not self._max_to_keep:
      return
    evaluated = None
    held = collections.OrderedDict()
    while len(self._maybe_delete) > self._max_to_keep:
      prefix, timestamp = self._maybe_delete.popitem(last=False)
      if evaluated is None:
        evaluated = self._evaluated_fn()
      if number(prefix) not in evaluated:
        held[prefix] = timestamp
        continue
      _delete(prefix)
    held.update(self._maybe_delete)
    self._maybe_delete = held


def create_manager(checkpoint: tf.train.Checkpoint, directory: str,
                   max_to_keep: int, global_step: tf.Variable,
                   init_fn: Optional[Callable[[], None]] = None,
                   evaluated_fn: Optional[Callable[[], Set[int]]] = None
                   ) -> tf.train.CheckpointManager:
  """Returns a manager saving `checkpoint` as `directory/ckpt-<step>`.

  Args:
    checkpoint: What to save (model, optimizer, global step, iterator...).
    directory: The run's `model_dir`.
    max_to_keep: Newest checkpoints kept; older ones are deleted.
    global_step: Numbers the checkpoints.
    init_fn: Called instead of a restore when there is no checkpoint yet.
    evaluated_fn: Returns the evaluated steps; if given, older checkpoints
      are deleted only once evaluated (`trainer.keep_until_evaluated`).
  """
  if evaluated_fn is not None:
    return _HoldingManager(
        checkpoint, directory=directory, max_to_keep=max_to_keep,
        step_counter=global_step, init_fn=init_fn, evaluated_fn=evaluated_fn)
  return tf.train.CheckpointManager(
      checkpoint, directory=directory, max_to_keep=max_to_keep,
      step_counter=global_step, init_fn=init_fn)


def trim(directory: str, max_to_keep: int, evaluated: Set[int]) -> List[str]:
  """Deletes the evaluated checkpoints beyond the newest `max_to_keep`.

  What a trainer with `trainer.keep_until_evaluated` held for a slower
  evaluator, and could not delete once it had ended; the evaluator calls
  this after the final step. Unevaluated ones stay. The state file is
  rewritten first, so it never lists a deleted checkpoint.

  Returns:
    The deleted prefixes.
  """
  state = tf.train.get_checkpoint_state(directory)
  paths = candidates(directory)
  if state is None or not max_to_keep:
    return []
  deleted = [p for p in paths[max_to_keep:] if number(p) in evaluated]
  if not deleted:
    return []
  # Names relative to `directory`, as `CheckpointManager` writes them, and
  # their save times: a manager only deletes checkpoints that have one.
  times = dict(zip(state.all_model_checkpoint_paths,
                   state.all_model_checkpoint_timestamps))
  kept = [p for p in reversed(paths) if p not in deleted]
  tf.compat.v1.train.update_checkpoint_state(
      directory, _state_name(directory, state.model_checkpoint_path),
      all_model_checkpoint_paths=[_state_name(directory, p) for p in kept],
      all_model_checkpoint_timestamps=[times[p] for p in kept if p in times]
      if all(p in times for p in kept) else None,
      last_preserved_timestamp=state.last_preserved_timestamp)
  for prefix in deleted:
    _delete(prefix)
  return deleted


def _state_name(directory: str, prefix: str) -> str:
  """What `update_checkpoint_state` is given for `prefix` to write its bare
  name, as `CheckpointManager` does: it rewrites each name relative to a
  `directory` that is not absolute (a relative one, a URL), so there the
  name goes joined onto it (`ckpt-30` would come out `../ckpt-30`)."""
  name = os.path.basename(prefix)
  return name if os.path.isabs(directory) else os.path.join(directory, name)


def _delete(prefix: str) -> None:
  """Deletes the files of the checkpoint at `prefix`."""
  for path in files.glob(prefix + ".*"):
    files.remove(path)


def copy(source: str, destination: str) -> None:
  """Copies the checkpoint at prefix `source` to prefix `destination`.

  The index, which readers open first, is copied last.
  """
  for path in files.glob(source + ".data-*") + [source + ".index"]:
    files.copy(path, destination + path[len(source):])


def candidates(directory: str) -> List[str]:
  """Returns the checkpoints in `directory`'s state file, newest first.

  `tf.train.get_checkpoint_state` already joins the relative paths of the
  state file onto `directory`, so the prefixes are usable as they come
  (relative when `directory` is): joining again broke relative model_dirs.
  """
  state = tf.train.get_checkpoint_state(directory)
  if state is None:
    return []
  paths = list(state.all_model_checkpoint_paths)
  if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
    paths.append(state.model_checkpoint_path)
  return sorted(paths, key=number, reverse=True)


def newest_step(directory: str) -> int:
  """Returns the step of the newest readable checkpoint in `directory`, or 0.

  Reads only the step counter, without building or restoring anything.
  """
  for path in candidates(directory):
    try:
      return saved_step(path)
    except Exception:  # pylint: disable=broad-except
      continue  # Damaged or foreign: `restore` reports it.
  return 0


def saved_keys(path: str) -> Optional[List[str]]:
  """The keys checkpoint `path` holds; None where it cannot be read (a
  damaged one, which `restore` passes over and reports)."""
  try:
    return [name for name, _ in tf.train.list_variables(path)]
  except Exception:  # pylint: disable=broad-except
    return None


def saved_step(path: str) -> int:
  """Returns the global step saved in checkpoint `path` (read alone)."""
  reader = tf.train.load_checkpoint(path)
  return int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))


def number(path: str) -> int:
  """Returns the step a checkpoint prefix `.../ckpt-<step>` ends with, or -1."""
  match = re.search(r"-(\d+)$", path)
  return int(match.group(1)) if match else -1


def shape_mismatch(error: Exception) -> Optional[str]:
  """Names the variable and both shapes when `error` is a restore's shape
  mismatch; None otherwise."""
  match = re.search(r"incompatible tensor with shape (\S+) when attempting to "
                    r"restore variable with shape (\S+) and name (\S+?)(:0)?\.",
                    str(error))
  if not match:
    return None
  return (f"variable {match.group(3)} has shape {match.group(2)} in this "
          f"model but {match.group(1)} in the checkpoint")


def _mismatch(error: Exception) -> Optional[str]:
  """Names the problem when `error` says the checkpoint is another model's."""
  mismatch = shape_mismatch(error)
  if mismatch:
    return mismatch
  if isinstance(error, AssertionError):
    return (str(error).strip().splitlines() or ["objects do not match"])[0]
  return None


def children_at(path: str, key: str) -> List[str]:
  """The names directly under `key` (a path such as `model`, '' for the
  root) among the variables of checkpoint `path`, sorted."""
  start = f"{key}/" if key else ""
  return sorted({name[len(start):].split("/")[0]
                 for name, _ in tf.train.list_variables(path)
                 if name.startswith(start)})


# The tensor holding a checkpoint's object graph.
_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
# What follows a variable's path in a checkpoint's key.
VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
# Layers a line lists of each side.
_LISTED_LAYERS = 6


def keyed_variables(root) -> Dict[str, tf.Variable]:
  """The variables under `root` by their checkpoint keys (less `VALUE`):
  each one's first path in a breadth-first walk, as a save names it."""
  found, seen, queue = {}, {id(root)}, [(root, "")]
  for obj, path in queue:
    if isinstance(obj, tf.Variable):
      found[path] = obj
      continue
    view = tf.train.TrackableView(obj)
    for name, child in view.children(obj).items():
      if id(child) not in seen:
        seen.add(id(child))
        escaped = name.replace(".", "..").replace("/", ".S")
        queue.append((child, f"{path}/{escaped}" if path else escaped))
  return found


def saved_names(path: str) -> Dict[str, str]:
  """The variables of checkpoint `path`: key (less `VALUE`) -> the name the
  variable had when saved (`conv1/kernel`), read from its object graph;
  {} where it has none.

  Keys are positional in Keras models (`model/layer_with_weights-0/...`):
  the names say which layer a key held.
  """
  reader = tf.train.load_checkpoint(path)
  if not reader.has_tensor(_OBJECT_GRAPH):
    return {}
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH))
  return {attribute.checkpoint_key[:-len(VALUE)]: attribute.full_name
          for node in graph.nodes for attribute in node.attributes
          if attribute.checkpoint_key.endswith(VALUE) and attribute.full_name
          and "/.OPTIMIZER_SLOT/" not in attribute.checkpoint_key}


def _name(variable: tf.Variable) -> str:
  return variable.name.split(":")[0]


def _base(name: str) -> str:
  """`name` less Keras's numeric suffixes (`dense_3/kernel` is
  `dense/kernel`): the names Keras makes up count in build order, and the
  same model built after others in one process gets other ones."""
  return "/".join(re.sub(r"_\d+$", "", part) for part in name.split("/"))


def _layers(names: Sequence[str]) -> str:
  """`conv1, conv2, ...`: the layers of variables `names`, in order."""
  layers = list(dict.fromkeys(name.rsplit("/", 1)[0] for name in names))
  more = ", ..." if len(layers) > _LISTED_LAYERS else ""
  return ", ".join(layers[:_LISTED_LAYERS]) + more


def not_held(root, path: str, key: str) -> Optional[str]:
  """Names the layers of `root`'s variables under `key` that checkpoint
  `path` holds under no key there by the names they had when saved, and
  the layers it does hold there (`has no conv1, conv2 (...)`: the
  checkpoint is the subject); None where it holds every one (names
  compared less Keras's numeric suffixes) or keeps no names.

  A restore matches variables by position: at the place of this model's
  `conv1/bias` the checkpoint may hold another model's `hidden1/bias`, and
  the shape mismatch would name a variable it does not have.
  """
  start = f"{key}/" if key else ""
  saved = saved_names(path)
  held = [name for saved_key, name in saved.items()
          if saved_key.startswith(start)]
  ours = [_name(variable) for variable_key, variable
          in keyed_variables(root).items() if variable_key.startswith(start)]
  bases = {_base(name) for name in held}
  missing = [name for name in ours if _base(name) not in bases]
  if not saved or not missing:
    return None
  where = f"`{key}` there" if key else "it"
  return (f"has no {_layers(missing)} (by the names saved with its "
          f"variables, {where} holds {_layers(held) or 'none'})")


def key_holding(root, path: str, key: str) -> Optional[str]:
  """The key of checkpoint `path` below `key` where every variable of
  `root`'s under `key` is saved, at its own place and by its own name (less
  Keras's numeric suffixes): a GAN run's `model/classifier` for a
  classifier. None if there is no one such key."""
  start = f"{key}/" if key else ""
  saved = saved_names(path)
  found = None
  for variable_key, variable in keyed_variables(root).items():
    if not variable_key.startswith(start):
      continue
    place = variable_key[len(start):]
    keys = {saved_key[:-len(place) - 1] for saved_key, name in saved.items()
            if _base(name) == _base(_name(variable)) and
            saved_key.startswith(start) and saved_key.endswith(f"/{place}")}
    found = keys if found is None else found & keys
    if not found:
      return None
  return next(iter(found)) if found and len(found) == 1 else None


def _missing_models(checkpoint: tf.train.Checkpoint,
                    path: str) -> Optional[str]:
  """Names the models of a Task with several that `path` holds nothing of
  (models added since it was saved), or None."""
  models = checkpoint._trackable_children().get("model")  # pylint: disable=protected-access
  if not isinstance(models, collections.abc.Mapping):
    return None
  try:
    held = children_at(path, "model")
  except (tf.errors.OpError, ValueError):
    return None
  missing = [name for name in models if name not in held]
  if not missing:
    return None
  return (f"it holds nothing of model(s) {', '.join(missing)} (added to the "
          f"Task since it was saved? it holds {', '.join(held)}): train in a "
          "new --model_dir, starting the models it holds from it: "
          f"`warm_start.checkpoint = '{path}'`, `warm_start.model = "
          f"{[name for name in held if name in models]!r}`")


def restore(manager: tf.train.CheckpointManager,
            path: Optional[str] = None, partial: bool = False,
            directory: Optional[str] = None,
            input_stale_until: int = -1) -> Optional[str]:
  """Restores `path`, or the newest restorable checkpoint, or initialises.

  Every tensor the restore reads is read first (`verify`), so a checkpoint
  damaged anywhere is passed over here, not at the first step. A training
  run that saves where it restores renames the files of those it passed over
  (`<prefix>-damaged`): it saves their steps again.

  Args:
    manager: Owns the checkpoint object (and, by default, the directory).
    path: A checkpoint prefix to restore, with no fallback; None for the
      newest in the directory that can be restored.
    partial: Expect the checkpoint to hold more than this run built (eval
      modes build no optimizer); otherwise every object built must match.
    directory: Where to look when it is not `manager.directory` (a
      non-chief worker restores the chief's checkpoints).
    input_stale_until: Checkpoints of steps up to this one are restored
      without their input position: saved with another batch size, it
      would give batches of the old shape (the caller puts the input in
      place).

  Returns:
    The restored prefix, or None when there was nothing to restore and
    `init_fn` ran instead.

  Raises:
    errors.CheckpointMismatch: If the checkpoint belongs to a different
      model.
    errors.InputMismatch: If its input position is another input
      pipeline's.
    errors.ConfigError: If no listed checkpoint could be restored, or a
      partial restore with EMA finds a checkpoint without.
  """
  paths = [path] if path else candidates(directory or manager.directory)
  if not paths:
    return manager.restore_or_initialize()
  # Only the run that saves here moves what it cannot restore (not an
  # evaluation, a dry run or another worker reading the chief's).
  owned = not partial and files.same_path(directory or manager.directory,
                                          manager.directory)
  failures = []
  for candidate in paths:
    if partial:
      _refuse_averages_it_lacks(manager.checkpoint, candidate)
    try:
      with_input = number(candidate) > input_stale_until
      if not _restore_one(manager.checkpoint, candidate, partial,
                          with_input) and with_input:
        console.info(
            f"input | {os.path.basename(candidate)} holds no input position "
            "(its run checkpointed none: parameter servers, several workers, "
            "the tf.data service, `trainer.input_position` \"skip\" or "
            "\"restart\"): the training input starts from its first batch; "
            "`trainer.input_position = \"skip\"` skips the batches trained "
            "on instead")
      if failures:
        _say_restored_instead(candidate, failures, owned)
      return candidate
    except Exception as e:  # pylint: disable=broad-except
      _raise_if_another_models(manager.checkpoint, candidate, e)
      _raise_if_another_input(candidate, e)
      _raise_if_peers_gone(candidate, e)
      first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
      console.info(f"checkpoint | cannot restore {candidate} "
                   f"({type(e).__name__}: {first_line[:200]})")
      failures.append(candidate)
  raise errors.ConfigError(
      f"no checkpoint in {directory or manager.directory} can be restored "
      f"(tried {', '.join(os.path.basename(f) for f in failures)}).")


def _say_restored_instead(restored: str, failures: List[str],
                          owned: bool) -> None:
  """Says which damaged checkpoints `restored` was restored instead of,
  setting their files aside where the run saves here (`owned`)."""
  kept = [checkpoint_verify.set_aside(failure) if owned else None
          for failure in failures]
  named = [os.path.basename(failure) + (
      f" (kept as {os.path.basename(aside)})" if aside else "")
           for failure, aside in zip(failures, kept)]
  console.info(f"checkpoint | restored {restored} instead of the "
               f"damaged {', '.join(named)}")


def _raise_if_another_models(checkpoint: tf.train.Checkpoint, path: str,
                             error: Exception) -> None:
  """Raises where `path` failed to restore (`error`) because it is another
  model's: no older checkpoint of the same directory would fit either.

  Raises:
    errors.CheckpointMismatch: Naming what does not fit.
  """
  mismatch = _missing_models(checkpoint, path)
  names_way_out = bool(mismatch)
  if not mismatch and shape_mismatch(error):
    # Said only where the variable is there under its own name.
    absent = not_held(checkpoint, path, "model")
    mismatch = f"it {absent}" if absent else shape_mismatch(error)
  mismatch = mismatch or _mismatch(error)
  if mismatch:
    raise errors.CheckpointMismatch(
        f"checkpoint {path} does not fit this model: {mismatch}.",
        names_way_out=names_way_out) from error


# What TensorFlow says where a saved iterator does not fit the pipeline it
# is restored into, after the node where it stopped.
_ANOTHER_PIPELINE = re.compile(
    r"Failed to restore dataset iterator from checkpoint: (\S+?)\.? Make "
    r"sure the dataset definition has not changed")


def _raise_if_another_input(path: str, error: Exception) -> None:
  """Raises where `path` failed to restore (`error`) because its input
  position was saved from another input pipeline: not damage (its checksums
  were checked first), and the older checkpoints hold the same pipeline's.

  Raises:
    errors.InputMismatch: Naming the pipeline as the cause and the ways on.
  """
  match = _ANOTHER_PIPELINE.search(str(error))
  if not match:
    return
  raise errors.InputMismatch(
      f"checkpoint {path} holds the position of another training input "
      f"pipeline (TensorFlow cannot restore its iterator into this run's: "
      f"it fails at {match.group(1)})",
      "resume without that position, with "
      "`trainer.input_position = \"skip\"` (this input read anew, past the "
      "batches trained on; keep it for later resumes of this run) or "
      "`\"restart\"` (this input from its first batch)") from error


# What TensorFlow raises on a worker when another of the cluster's tasks is
# gone (killed, or its run refused by the model_dir's lease): collectives
# aborted, a peer's socket closed or unreachable.
_PEERS_GONE = re.compile(
    r"Collective ops is aborted|Socket closed|failed to connect to all "
    r"addresses|Connection reset by peer|Deadline Exceeded")


def _raise_if_peers_gone(path: str, error: Exception) -> None:
  """Raises where `path` failed to restore because the cluster's other
  tasks are gone, not because it is damaged: trying older checkpoints
  would fail the same way and blame sound ones.

  Raises:
    errors.RunError: Naming the lost peers as the cause.
  """
  if not isinstance(error, (tf.errors.UnavailableError,
                            tf.errors.AbortedError,
                            tf.errors.DeadlineExceededError)):
    return
  if not _PEERS_GONE.search(str(error)):
    return
  first_line = (str(error).strip().splitlines() or [""])[0][:200]
  raise errors.RunError(
      f"the other workers of this cluster are gone while restoring {path} "
      f"({type(error).__name__}: {first_line}): the checkpoint is not "
      "blamed, and no older one is tried. Is the chief running? It stops "
      "when another process still holds the model_dir's lease; restart "
      "every task of the job together.") from error


# The names under which a checkpoint holds an optimizer's wrappers: Model
# Garden's EMA keeps the optimizer it wraps as `ema_base_optimizer`, and
# tf_keras's LossScaleOptimizer its dynamic loss scale as `loss_scale`.
EMA = "ema_base_optimizer"
LOSS_SCALE = "loss_scale"


def holds(keys: Sequence[str], name: str) -> bool:
  """Whether one of checkpoint `keys` (`optimizer/loss_scale/good_steps`)
  passes through an object saved as `name`."""
  return any(name in key.split("/") for key in keys)


def tracks(root, name: str) -> bool:
  """Whether `root` holds an object under `name`, at any depth: what a save
  would name so (`holds`), even before its variables exist (an evaluation's
  optimizer makes none)."""
  seen, queue = {id(root)}, [root]
  for obj in queue:
    if isinstance(obj, tf.Variable):
      continue
    for child_name, child in tf.train.TrackableView(obj).children(
        obj).items():
      if child_name == name:
        return True
      if id(child) not in seen:
        seen.add(id(child))
        queue.append(child)
  return False


def _refuse_averages_it_lacks(checkpoint: tf.train.Checkpoint,
                              path: str) -> None:
  """Refuses to evaluate with EMA a checkpoint `path` saved without: a
  partial restore would leave the averages, which the evaluation uses, at
  the weights the model was built with.

  Raises:
    errors.ConfigError: Naming `ema.decay`.
  """
  saved = saved_keys(path)
  if saved is not None and tracks(checkpoint, EMA) and not holds(saved, EMA):
    raise errors.ConfigError(
        f"checkpoint {path} holds no weight averages (saved without EMA), "
        "which this evaluation, with `ema.decay` set, evaluates: they would "
        "be the weights the model was built with; evaluate it without "
        "`ema.decay`.")


# The name under which a checkpoint holds the training input's iterator.
INPUT_POSITION = "train_iterator"
# The name under which it holds the global batch size its input was read in
# (absent from checkpoints saved before it was recorded).
BATCH_SIZE = "global_batch_size"


def recorded_batch_size(path: str) -> Optional[int]:
  """The global batch size the input of checkpoint `path` was read in;
  None where it is not recorded."""
  reader = tf.train.load_checkpoint(path)
  key = f"{BATCH_SIZE}/.ATTRIBUTES/VARIABLE_VALUE"
  return int(reader.get_tensor(key)) if reader.has_tensor(key) else None


def _restore_one(checkpoint: tf.train.Checkpoint, path: str,
                 partial: bool, with_input: bool = True) -> bool:
  """Restores `path` into `checkpoint`'s objects; its input position only
  `with_input`.

  Returns:
    False if this run checkpoints its input position but `path` holds none
    (its iterator then stays at the start); True otherwise.
  """
  children = checkpoint._trackable_children()  # pylint: disable=protected-access
  saved = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
  position_restored = INPUT_POSITION not in children or (
      INPUT_POSITION in saved)
  left_out = set()
  if not position_restored or not with_input:
    # A checkpoint of a run whose input position could not be saved, read
    # by one that saves it: everything else must still match.
    left_out.add(INPUT_POSITION)
  if BATCH_SIZE in children and BATCH_SIZE not in saved:
    left_out.add(BATCH_SIZE)  # Saved before batch sizes were recorded.
  if left_out:
    # (The save counter is the Checkpoint's own; saves here are numbered by
    # step.)
    checkpoint = tf.train.Checkpoint(**{
        name: child for name, child in children.items()
        if name not in left_out | {"save_counter"}})
  # Damage in what is read late (optimizer slots) is found now, while the
  # one before can still be restored instead.
  checkpoint_verify.verify(path, {_OBJECT_GRAPH,
                                  "save_counter",
                                  *checkpoint._trackable_children()})  # pylint: disable=protected-access
  status = checkpoint.restore(path)
  # Marked first: a status that fails the check below would otherwise log
  # every value it left unread when it is collected (at exit, say).
  status.expect_partial()
  if not partial:
    # Everything built must match; optimizer slots not built yet are filled
    # when the first step creates them (deferred restoration).
    status.assert_existing_objects_matched()
  return position_restored


# What the name of an interrupted checkpoint save's folder matches, in
# `remove_interrupted_saves`'s `owned`.
SAVES = "ckpt"


def remove_interrupted_saves(directory: str,
                             owned: Sequence[str]) -> List[str]:
  """Deletes what killed saves and writes of this process's role left.

  Checkpoint saves write into `<prefix>_temp` and rename it when complete
  (the state file lists completed saves only); exports and records write
  `.tmp-<name>-*` folders and files (`files.write_directory`,
  `files.write_text`) and rename them. Such leftovers are never read, and a
  later write of the same name would trip over them. Only `owned` ones go:
  a trainer and an evaluator may share `directory`, and one must not remove
  what the other is writing.

  Args:
    directory: The model_dir.
    owned: What this process writes: `SAVES` (checkpoint saves), and names
      at the top of `directory`, files (leftovers of their atomic writes)
      or folders (every leftover anywhere inside).

  Returns:
    The removed paths.
  """
  removed = []

  def remove(path: str) -> None:
    files.remove_any(path)
    removed.append(path)
    console.info(f"checkpoint | removed {path}, left by an interrupted write")

  def interrupted_save(path: str) -> bool:
    name = os.path.basename(path)
    return (name.startswith("ckpt-") and name.endswith("_temp") and
            files.isdir(path))

  for name in files.listdir(directory):
    path = os.path.join(directory, name)
    if (SAVES in owned and interrupted_save(path)) or any(
        name.startswith(f"{files.TEMPORARY_PREFIX}{target}-")
        for target in owned):
      remove(path)
    elif name in owned and files.isdir(path):
      # On a URL the walk goes on into a removed folder, finding nothing.
      for root, folders, names in files.walk(path):
        for leftover in sorted(folders + names):
          found = os.path.join(root, leftover)
          if (interrupted_save(found) or
              leftover.startswith(files.TEMPORARY_PREFIX)):
            remove(found)
        folders[:] = [f for f in folders
                      if files.isdir(os.path.join(root, f))]
  return removed
