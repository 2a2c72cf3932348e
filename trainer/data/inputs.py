"""Distributed input: batching per replica with a checkpointable iterator.

Iterators from `strategy.experimental_distribute_dataset` and
`distribute_datasets_from_function` cannot be saved in a checkpoint
(tensorflow/tensorflow#56372), and exact resume needs the input position. So
each worker reads one plain `tf.data` iterator over batches of
`per_replica_batch_size * local_replicas` examples (checkpointable), and each
batch is split into per-replica slices inside the step function with
`strategy.experimental_distribute_values_from_function`. On this stack the
split path measured slightly faster than a distributed iterator.
"""

import functools
from typing import Callable, Dict, Mapping, Optional, Tuple
import weakref

import tensorflow as tf

from trainer import console
from trainer import errors
from trainer import graph_code
from trainer.data import eval_sets
from trainer.data import input_state
from trainer.data import mixture as mixture_lib
from trainer.data import service as data_service
from trainer.distribute import cluster
from trainer.model import task as task_lib

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
# (a batch, a stateless seed of shape [2]) -> the transformed batch.
BatchFn = Callable[[object, tf.Tensor], object]

# What `examples_from_blocks` returned, mapped to the blocks it unbatched.
_BLOCKS: "weakref.WeakKeyDictionary[tf.data.Dataset, tf.data.Dataset]" = (
    weakref.WeakKeyDictionary())


def examples_from_blocks(blocks: tf.data.Dataset) -> tf.data.Dataset:
  """Returns the examples of a dataset of example blocks: `blocks.unbatch()`.

  Each element of `blocks` stacks examples on a leading axis of any length
  (a shuffled epoch of indices, say). `DistributedInput` batches what this
  returns a block at a time (`rebatch`, a cost per batch) instead of an
  example at a time (`unbatch().batch(n)`, a cost per example, which tf.data
  does not fuse): that halved the CPU time of the in-memory MNIST pipeline,
  measured. Anything else reading the result sees plain examples.
  """
  examples = blocks.unbatch()
  _BLOCKS[examples] = blocks
  return examples


# What `shuffled_indices` returned, mapped to its batches by size.
_INDEXED: ("weakref.WeakKeyDictionary[tf.data.Dataset, "
           "Callable[[int], tf.data.Dataset]]") = weakref.WeakKeyDictionary()


def _shuffled(positions: tf.Tensor, count: int, seed: int) -> tf.Tensor:
  """The indices at `positions` of the endless stream of epochs of
  `range(count)`, epoch e in the stateless permutation of `(seed, e)`
  (`index_shuffle`, the bijection tf.data's own global shuffle uses)."""
  epochs = positions // count
  seeds = tf.stack([tf.fill(tf.shape(epochs), tf.constant(seed, tf.int64)),
                    epochs, tf.zeros_like(epochs)], axis=-1)
  # The op itself: `tf.random.experimental.index_shuffle` pads any seed by
  # one row, so it refuses one seed per index (TensorFlow 2.20).
  return tf.raw_ops.RandomIndexShuffle(
      index=positions % count, seed=seeds,
      max_index=tf.constant(count - 1, tf.int64), rounds=4)


def shuffled_indices(count: int, seed: int) -> tf.data.Dataset:
  """Returns an endless stream of indices into `count` examples held in
  memory, every epoch a new stateless permutation, for `Task.build_inputs`.

  `DistributedInput` batches it by a batch counter alone: batch k holds the
  indices at positions `k * size` onwards, computed from k (no per-index
  cost, none of `rebatch`'s buffers), so a training iterator's checkpoint
  holds a counter and no prefetched batch (symbolic checkpointing): a few
  hundred bytes, where the epoch blocks and prefetched batches of images it
  replaces held 1.1 MB for CIFAR-10 (measured). Anything else reading the
  result (a mixture, a parameter-server worker's filter) sees the same
  indices one at a time.
  """
  if count < 1:
    return tf.data.Dataset.range(0)
  examples = tf.data.Dataset.counter().map(
      lambda position: _shuffled(position, count, seed))

  def batches(size: int) -> tf.data.Dataset:
    offsets = tf.range(size, dtype=tf.int64)
    return tf.data.Dataset.counter().map(
        lambda batch: _shuffled(batch * size + offsets, count, seed))

  _INDEXED[examples] = batches
  return examples


def examples_from_arrays(arrays, training: bool,
                         input_context: Optional[tf.distribute.InputContext],
                         seed: int = 0) -> tf.data.Dataset:
  """Returns this input pipeline's examples of a split held in memory, for
  `Task.build_inputs`.

  With several input pipelines each keeps every n-th example, from its own
  index on; training examples come in a seeded order drawn anew every epoch.

  Args:
    arrays: An array, or a tuple or dict of them, one example per row.
    training: Shuffle (the training split) or keep the order.
    input_context: Which of how many input pipelines this is.
    seed: Seeds the order.
  """
  dataset = tf.data.Dataset.from_tensor_slices(arrays)
  if input_context and input_context.num_input_pipelines > 1:
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
  if training:
    dataset = dataset.shuffle(len(tf.nest.flatten(arrays)[0]), seed=seed,
                              reshuffle_each_iteration=True)
  return dataset


def per_replica_batch_size(global_batch_size: int, num_replicas: int,
                           name: str = "global_batch_size") -> int:
  """Returns `global_batch_size / num_replicas`, which must be whole.

  Raises:
    errors.ConfigError: If the batch does not divide evenly over the replicas.
  """
  if global_batch_size < 1:
    raise errors.ConfigError(
        f"`{name}` ({global_batch_size}) must be positive.")
  if global_batch_size % num_replicas:
    raise errors.ConfigError(
        f"`{name}` ({global_batch_size}) must be divisible by the number of "
        f"replicas ({num_replicas}).")
  return global_batch_size // num_replicas


class DistributedInput:
  """A worker's batched dataset and the split of its batches over replicas.

  Attributes:
    dataset: Batches of `per_replica_batch_size * local_replicas` examples.
    per_replica_batch_size: Examples each replica receives per step.
    input_context: The `InputContext` the dataset was built for.
    mixture: The rates of the Task's training sources where it returns
      several; the dataset's batches then come as `(batch, the source index
      of each example)` (`sources` splits them), else None.
  """

  def __init__(self, strategy: tf.distribute.Strategy, dataset_fn: DatasetFn,
               global_batch_size: int, training: bool,
               batch_size_name: str = "global_batch_size",
               worker: cluster.WorkerInfo = cluster.WorkerInfo(),
               shard: bool = True, private_threads: int = 0,
               batch_fn: Optional[BatchFn] = None,
               batch_fn_parallel_calls: int = 0,
               deterministic: bool = True,
               remote: Optional[Callable[[tf.data.Dataset],
                                         tf.data.Dataset]] = None,
               mixture: Optional[mixture_lib.Mixture] = None,
               task_name: str = "Task"):
    """Builds the worker's dataset.

    Args:
      strategy: The strategy whose replicas consume the batches.
      dataset_fn: Returns a dataset of single (unbatched) examples for an
        `InputContext`; it may shard by the context itself.
      global_batch_size: Examples per step summed over all replicas.
      training: Repeat forever and drop the last partial batch when True; a
        single pass that keeps the partial last batch otherwise.
      batch_size_name: How the batch size is called in error messages.
      worker: This process's place among the workers.
      shard: Give each worker its own input pipeline id (a disjoint shard
        when the task shards by `InputContext`); False gives every worker the
        whole data, as multi-worker evaluation needs.
      private_threads: Size of a private tf.data thread pool; 0 for none.
      batch_fn: Transforms each batch (vectorised preprocessing), given a
        seed that differs for every batch and input pipeline and is part of
        the iterator's state.
      batch_fn_parallel_calls: `batch_fn` calls at once: 0 runs it in the
        prefetch thread, without a thread of its own; -1 lets tf.data choose
        (`AUTOTUNE`).
      deterministic: Keep the elements' order where tf.data could trade it
        for speed (parallel map and interleave).
      remote: Has the batches produced elsewhere: takes the pipeline up to
        here (examples, batching, `batch_fn`) and returns the dataset that
        reads its batches (`data_service.distribute`). Its iterator cannot
        be checkpointed.
      mixture: Mixes the named training datasets `dataset_fn` returns.
      task_name: The Task's class name, for error messages.
    """
    self._strategy = strategy
    num_replicas = strategy.num_replicas_in_sync
    self.global_batch_size = global_batch_size
    self.per_replica_batch_size = per_replica_batch_size(
        global_batch_size, num_replicas, batch_size_name)
    # One input pipeline per worker feeds that worker's local replicas.
    self._num_local_replicas = num_replicas // worker.num_workers
    context = tf.distribute.InputContext(
        num_input_pipelines=worker.num_workers if shard else 1,
        input_pipeline_id=worker.worker_index if shard else 0,
        num_replicas_in_sync=num_replicas)
    self.input_context = context
    self._dataset_fn = dataset_fn
    self._training = training
    self._private_threads = private_threads
    self._batch_fn = batch_fn
    self._batch_fn_parallel_calls = batch_fn_parallel_calls or None
    self._deterministic = deterministic
    self._remote = remote
    self.mixture = mixture
    # A mixture's sources' sizes in examples, by name (None where unknown,
    # or infinite), as this pipeline's first build found them.
    self.source_sizes: Dict[str, Optional[int]] = {}
    self._task_name = task_name
    self._short_last_batch = True  # Of an evaluation set; set by `build`.
    self.dataset = self.build()

  def build(self, shard_examples: Optional[Callable[
      [tf.data.Dataset], tf.data.Dataset]] = None) -> tf.data.Dataset:
    """Builds the batched dataset anew (`dataset` is the first one built).

    Args:
      shard_examples: Filters the examples the task returns, before they are
        repeated and batched.

    Raises:
      errors.ConfigTypeError: If `build_inputs` returns no `tf.data.Dataset`.
      errors.ConfigError: For batched or too small data (`check_unbatched`,
        `_check_not_empty`).
    """
    dataset = self._mixed(self._dataset_fn(self.input_context))
    if not isinstance(dataset, tf.data.Dataset):
      raise errors.ConfigTypeError(
          "`build_inputs` must return a `tf.data.Dataset`, got "
          f"{type(dataset).__name__}.")
    check_unbatched(self._examples_spec(dataset.element_spec))
    batch_size = self.per_replica_batch_size * self._num_local_replicas
    _check_not_empty(dataset, batch_size if self._training else 1,
                     self._training)
    if shard_examples is not None:
      dataset = shard_examples(dataset)  # No longer blocks, if it was.
    if not self._training:
      # A set of known size whose last batch gives every replica an example
      # needs no guard for an empty replica (`may_leave_replicas_empty`).
      examples = _known_size(dataset)
      self._short_last_batch = (
          examples is None or
          0 < examples % batch_size < self._num_local_replicas)
    indexed = (_INDEXED.get(dataset)
               if self._training and shard_examples is None else None)
    if indexed is not None:
      dataset = indexed(batch_size)  # Endless, and saved by its counter.
    else:
      blocks = _BLOCKS.get(dataset)
      if blocks is not None:
        dataset = blocks
      if self._training:
        dataset = dataset.repeat()
      batch = dataset.batch if blocks is None else dataset.rebatch
      dataset = batch(batch_size, drop_remainder=self._training)
    if self._batch_fn is not None:
      pipeline = tf.constant(self.input_context.input_pipeline_id, tf.int64)
      batch_fn = self._batch_fn
      if self.mixture is not None:  # The Task's part only.
        batch_fn = lambda batch, seed, task_fn=batch_fn: (  # pylint: disable=g-long-lambda
            task_fn(batch[0], seed), batch[1])
      dataset = dataset.enumerate().map(
          lambda index, batch: batch_fn(batch, tf.stack([pipeline, index])),
          num_parallel_calls=self._batch_fn_parallel_calls)
    options = tf.data.Options()
    options.deterministic = self._deterministic
    if indexed is not None and self._remote is None:
      # Positions only: the batches prefetched are recomputed on restore.
      # (Not for every pipeline: it slows some, `streaming.resumable`.)
      options.experimental_symbolic_checkpoint = (
          input_state.symbolic_blocker(dataset) is None)
    if self._private_threads:
      options.threading.private_threadpool_size = self._private_threads
    # Before `remote`: the options travel with the pipeline to where it runs.
    dataset = dataset.with_options(options)
    if self._remote is not None:
      dataset = self._remote(dataset)
    return dataset.prefetch(tf.data.AUTOTUNE)

  def _mixed(self, built):
    """What `build_inputs` returned, its sources mixed where it returned
    several (`mixture_lib.Mixture.mix`).

    Raises:
      errors.ConfigError: For several training datasets without rates.
    """
    if self.mixture is not None:
      if isinstance(built, Mapping):  # For the `mixture |` line.
        self.source_sizes = {name: _known_size(source)
                             for name, source in built.items()}
      return self.mixture.mix(built, self._task_name,
                              self.input_context.input_pipeline_id)
    if isinstance(built, Mapping) and self._training:
      names = ", ".join(map(str, built))
      raise errors.ConfigError(
          f"{self._task_name}.build_inputs(training=True) returns several "
          f"datasets ({names}) but no rates: give them in `trainer.mixture` "
          '(e.g. `trainer.mixture = {"name": 0.5, ...}`) or '
          f"`{self._task_name}.mixture_rates`.")
    return built

  def _examples_spec(self, element_spec):
    """The Task's part of an element (a mixture's also holds the source)."""
    return element_spec if self.mixture is None else element_spec[0]

  @property
  def element_spec(self):
    """The spec of the Task's batches (without a mixture's sources)."""
    return self._examples_spec(self.dataset.element_spec)

  @graph_code.written_for_graphs
  def sources(self, batch):
    """Returns `(the Task's batch, each example's source index)`; the index
    is None without a mixture."""
    if self.mixture is None:
      return batch, None
    return batch

  @property
  def remote(self) -> bool:
    """Whether the batches are produced elsewhere (tf.data service); an
    iterator over them cannot be checkpointed."""
    return self._remote is not None

  def checkpointable(self) -> bool:
    """Whether an iterator over `dataset` can be saved in a checkpoint;
    warns why not when it cannot."""
    return not self.remote and is_checkpointable(self.dataset)

  def per_worker_dataset_fn(self, num_workers: int
                            ) -> Callable[[], tf.data.Dataset]:
    """Returns the `dataset_fn` for `create_per_worker_dataset`.

    With parameter servers the dataset is built on each worker, where the
    worker's index is only known as a tensor (not as the Python integer an
    `InputContext` holds): so each worker keeps every `num_workers`-th of the
    examples the task returns, from its own index on. Workers shuffling with
    the same seed then read disjoint examples in every epoch.

    The coordinator traces it in a `tf.function`; AutoGraph stays out of it:
    `build_inputs` is Python that builds a pipeline (loading arrays, say,
    with scikit-learn), and converting it only printed warnings.
    """
    if num_workers == 1:
      return tf.autograph.experimental.do_not_convert(self.build)

    @tf.autograph.experimental.do_not_convert
    def dataset_fn() -> tf.data.Dataset:
      index = tf.distribute.coordinator.experimental_get_current_worker_index()
      return self.build(lambda examples: examples.shard(num_workers, index))

    return dataset_fn

  @property
  def may_leave_replicas_empty(self) -> bool:
    """Whether `split` can give a replica no example: an evaluation input
    over several local replicas whose last batch holds fewer examples than
    there are replicas, or may (its size unknown); training batches are
    always full."""
    return (not self._training and self._num_local_replicas > 1 and
            self._short_last_batch)

  @graph_code.written_for_graphs
  def split(self, batch):
    """Splits a worker batch into per-replica values for `strategy.run`.

    Call it inside the step function. A full batch gives every replica
    `per_replica_batch_size` examples, in order. A partial last batch (of
    an evaluation input) is split as evenly as it goes: 9 examples on 2
    replicas are 5 + 4, the first replicas taking one more. Only a batch
    smaller than the replica count leaves replicas with no example
    (`may_leave_replicas_empty`).
    """
    if self._num_local_replicas == 1:
      return batch
    num_local = self._num_local_replicas
    # Training batches (`drop_remainder`) have a static size: the slices'
    # bounds are Python numbers and the slices keep a static shape.
    # Evaluation batches may be partial: the bounds are computed in the
    # graph from the batch's size.
    size = tf.nest.flatten(batch)[0].shape[0]
    if size is None:
      size = tf.shape(tf.nest.flatten(batch)[0])[0]
    each, extra = size // num_local, size % num_local

    def replica_slice(context: tf.distribute.experimental.ValueContext):
      local = context.replica_id_in_sync_group % num_local
      # The first `extra` replicas take `each + 1` examples, the others
      # `each`: sizes differ by at most one, and the slices tile the batch.
      start = local * each + _minimum(local, extra)
      stop = start + each + _less(local, extra)
      return tf.nest.map_structure(lambda t: t[start:stop], batch)

    return self._strategy.experimental_distribute_values_from_function(
        replica_slice)


def _minimum(a: int, b):
  """`min(a, b)`, in Python where `b` is a Python number."""
  return min(a, b) if isinstance(b, int) else tf.minimum(a, b)


def _less(a: int, b):
  """`1 if a < b else 0`, in Python where `b` is a Python number."""
  return int(a < b) if isinstance(b, int) else tf.cast(a < b, b.dtype)


def check_unbatched(element_spec) -> None:
  """Raises if the examples look batched already.

  `ds.batch(n)` gives every component a leading dimension of unknown size;
  batched again by the framework, each step would hold n times the
  configured examples, and losses and examples/s would be off by that
  factor without any error.

  Raises:
    errors.ConfigError: Naming `build_inputs` and what to do.
  """
  specs = tf.nest.flatten(element_spec)
  if specs and all(
      isinstance(spec, tf.TensorSpec) and spec.shape.rank and
      spec.shape[0] is None for spec in specs):
    shapes = ", ".join(str(spec.shape) for spec in specs)
    raise errors.ConfigError(
        f"`build_inputs` returns batched data (every element has a leading "
        f"dimension of unknown size: {shapes}): return single examples "
        "and let the framework batch them (remove `.batch(...)`; batch "
        "sizes are `trainer.global_batch_size` and "
        "`trainer.eval_batch_size`).")


def check_validation_steps(validation_steps: int, num_batches: int,
                           set_name: Optional[str] = None) -> None:
  """Raises if `validation_steps` asks for more than `num_batches` (the eval
  set's batches, when known: >= 0); -1 (a full pass) never does.

  Args:
    validation_steps: The batches asked for.
    num_batches: The batches the set has; negative when unknown.
    set_name: The evaluation set's name; None for the unnamed one.

  Raises:
    errors.ConfigError: Naming the setting and the eval set's size.
  """
  if 0 <= num_batches < validation_steps:
    dataset = ("the evaluation dataset" if set_name is None else
               f"the evaluation set {set_name!r}")
    raise errors.ConfigError(
        f"`trainer.validation_steps` ({validation_steps}) is more than the "
        f"{num_batches} batch(es) of {dataset}; use -1 for one full pass.")


def _check_not_empty(dataset: tf.data.Dataset, min_examples: int,
                     training: bool) -> None:
  """Raises if the dataset is known to hold fewer than `min_examples`.

  Only a cardinality tf.data knows without reading is checked (unknown for
  filtered or generated data); a training input that turns out empty is
  reported by the trainer at the first step instead.
  """
  if not tf.executing_eagerly():
    return  # Built inside a worker's function; the chief checked it.
  count = int(dataset.cardinality())
  if count < 0:  # INFINITE or UNKNOWN.
    return
  split = "training" if training else "evaluation"
  if count == 0:
    raise errors.ConfigError(f"the {split} dataset is empty.")
  if count < min_examples:
    leading = {spec.shape[0] if spec.shape.rank else None
               for spec in tf.nest.flatten(dataset.element_spec)}
    hint = ("" if None in leading or len(leading) != 1 else
            f" (its elements look like batches of {leading.pop()}: "
            "`build_inputs` must return single examples)")
    raise errors.ConfigError(
        f"the {split} dataset has {count} example(s), fewer than one batch "
        f"({min_examples}); lower the batch size{hint}.")


def is_checkpointable(dataset: tf.data.Dataset) -> bool:
  """Whether an iterator over `dataset` can be saved; warns when it cannot.

  Pipelines with Python state (`from_generator`, `py_function`, tfds mock
  data) cannot. tf.data has no public check: serialising the dataset graph
  while refusing external state is the one that saving the iterator makes.
  """
  try:
    dataset._as_serialized_graph(  # pylint: disable=protected-access
        external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL)
    return True
  except (tf.errors.FailedPreconditionError,
          tf.errors.UnimplementedError) as e:
    reason = e.message.split("[Op:")[0].split("}}")[-1].strip()
    console.warning(
        f"the training input cannot be checkpointed ({reason}); a restarted "
        "run skips the batches already trained on instead, which takes "
        "longer.")
    return False


def for_task(task: task_lib.Task, training: bool,
             strategy: tf.distribute.Strategy, config, runtime,
             worker: cluster.WorkerInfo = cluster.WorkerInfo(),
             dataset_fn: Optional[DatasetFn] = None) -> DistributedInput:
  """Builds this worker's training or evaluation input for `task`.

  Training input pipelines each read their own shard; every worker
  evaluates the whole eval split (the same number of steps everywhere, so no
  collective waits on a worker with fewer batches, and the metrics, summed
  over all replicas, keep their ratios). With `runtime.data_service`, the
  training batches come from the tf.data service; evaluation reads here.

  Args:
    task: Supplies `build_inputs` and `preprocess_batch`.
    training: Which split.
    strategy: Where the batches go.
    config: A `trainer.TrainerConfig` (the batch sizes).
    runtime: A `trainer.RuntimeConfig` (the pipeline's threads).
    worker: This process's place among the workers.
    dataset_fn: Returns the examples, in place of `task.build_inputs`
      (one named evaluation set of several, say).
  """

  def preprocess(batch, seed):
    return task.preprocess_batch(batch, training, seed)

  return DistributedInput(
      strategy, dataset_fn or (lambda ctx: task.build_inputs(training, ctx)),
      config.global_batch_size if training else config.eval_batch_size,
      training=training,
      batch_size_name=("trainer.global_batch_size" if training else
                       "trainer.eval_batch_size"),
      worker=worker, shard=training,
      private_threads=runtime.dataset_num_private_threads if training else 0,
      # Only an override costs a pipeline stage.
      batch_fn=(preprocess if task_lib.overrides(task, "preprocess_batch")
                else None),
      batch_fn_parallel_calls=runtime.dataset_batch_parallel_calls,
      deterministic=runtime.dataset_deterministic,
      remote=(functools.partial(data_service.distribute, runtime=runtime)
              if training and runtime.data_service else None),
      mixture=(mixture_lib.for_task(
          task, config, runtime,
          examples_per_step=config.global_batch_size // worker.num_workers)
               if training else None),
      task_name=type(task).__name__)


def for_mode(task: task_lib.Task, strategy: tf.distribute.Strategy, config,
             runtime, worker: cluster.WorkerInfo, training: bool,
             evaluating: bool
             ) -> Tuple[Optional[DistributedInput],
                        Optional[Dict[Optional[str], DistributedInput]]]:
  """Builds the train and eval inputs a mode needs (None for the other), and
  says where the training input comes from.

  Returns:
    The training input, and the evaluation sets' inputs by name: `{None:
    input}` for a Task's one unnamed set (`trainer.data.eval_sets`).

  Raises:
    errors.ConfigError: For `trainer.validation_steps` beyond a known eval
      set, an empty or badly named eval set, or a tf.data service that
      cannot be reached.
  """
  train_input = eval_inputs = None
  if training:
    if runtime.data_service:
      data_service.check_reachable(runtime)
    train_input = for_task(task, True, strategy, config, runtime, worker)
    if worker.num_workers > 1:
      context = train_input.input_context
      console.info(f"input | worker {worker.worker_index} reads input "
                   f"pipeline {context.input_pipeline_id} of "
                   f"{context.num_input_pipelines}")
    if runtime.data_service:
      console.info(data_service.describe(runtime))
    if train_input.mixture is not None:
      console.info(f"mixture | {train_input.mixture.describe()}"
                   f"{_sizes_text(train_input.source_sizes)}")
  if evaluating or config.export.at_end:
    eval_inputs = for_eval_sets(task, strategy, config, runtime, worker)
    for name, eval_input in eval_inputs.items() if evaluating else ():
      # -1 (UNKNOWN) or -2 (INFINITE): checked as it runs.
      check_validation_steps(
          eval_sets.steps_for(config.validation_steps, name),
          int(eval_input.dataset.cardinality()), name)
    if evaluating and None not in eval_inputs:
      console.info("eval sets | " + ", ".join(
          _eval_set_text(name, eval_input, config)
          for name, eval_input in eval_inputs.items()))
  return train_input, eval_inputs


def _known_size(dataset) -> Optional[int]:
  """A dataset's number of elements, None where unknown or infinite."""
  if not isinstance(dataset, tf.data.Dataset) or not tf.executing_eagerly():
    return None
  size = int(dataset.cardinality())
  return size if size >= 0 else None


def _sizes_text(sizes: Mapping[str, Optional[int]]) -> str:
  """` | sizes: clean 1437, noisy ? examples`, or nothing if none known."""
  if not any(size is not None for size in sizes.values()):
    return ""
  return " | sizes: " + ", ".join(
      f"{name} {'?' if size is None else size}"
      for name, size in sizes.items()) + " examples"


def _eval_set_text(name: str, eval_input: "DistributedInput", config) -> str:
  """`clean: 3 batch(es) of 60` (`?` where unknown), with how many of them
  an evaluation reads where `validation_steps` limits it, and `held out`
  where the set is never judged."""
  batches = _known_size(eval_input.dataset)
  text = (f"{name}: {'?' if batches is None else batches} batch(es) of "
          f"{config.eval_batch_size}")
  notes = []
  steps = eval_sets.steps_for(config.validation_steps, name)
  if steps > 0:
    notes.append(f"{steps} evaluated")
  if name in config.held_out_sets:
    notes.append("held out, never judged")
  return text + (f" ({'; '.join(notes)})" if notes else "")


def for_eval_sets(task: task_lib.Task, strategy: tf.distribute.Strategy,
                  config, runtime,
                  worker: cluster.WorkerInfo = cluster.WorkerInfo()
                  ) -> Dict[Optional[str], DistributedInput]:
  """Builds the input of each evaluation set `trainer.eval_sets` chooses
  (all by default), by name: `{None: input}` for a Task whose
  `build_inputs(training=False)` returns one dataset.

  `build_inputs` is called once for all the sets; a set's input built
  again (a parameter-server worker's) calls it again and takes its set.

  Raises:
    errors.ConfigError: For an empty dict, an empty set, a name that cannot
      be a TensorBoard run, a setting naming a set there is not, or a
      judged metric (`best_checkpoint.metric`, `early_stopping.metric`) of
      no set or of a set not evaluated.
  """
  # The context `for_task` gives an evaluation input: every worker reads
  # the whole of every set.
  context = tf.distribute.InputContext(
      num_input_pipelines=1, input_pipeline_id=0,
      num_replicas_in_sync=strategy.num_replicas_in_sync)
  found = task.build_inputs(False, context)
  named = isinstance(found, Mapping)
  unused = dict(found) if named else {None: found}
  eval_sets.check_names(
      list(unused), config.held_out_sets, config.eval_sets,
      config.validation_steps,
      judged={"best_checkpoint.metric": config.best_checkpoint.metric,
              "early_stopping.metric": config.early_stopping.metric})

  def set_fn(name: Optional[str]) -> DatasetFn:
    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      if name in unused:
        return unused.pop(name)
      again = task.build_inputs(False, ctx)
      return again[name] if named else again
    return dataset_fn

  built = {}
  for name in eval_sets.chosen_names(list(unused), config.eval_sets):
    dataset = unused[name]
    if named and _known_size(dataset) == 0:
      raise errors.ConfigError(f"the evaluation set {name!r} is empty.")
    built[name] = for_task(task, False, strategy, config, runtime, worker,
                           dataset_fn=set_fn(name))
  return built
