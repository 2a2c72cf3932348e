"""What the training input costs in a checkpoint, and what holds it.

A checkpointed `tf.data` iterator saves its position and every element its
pipeline holds at that moment: a `shuffle` buffer full of examples, a
memory `cache()`, prefetched batches. Nothing says so, and a user's
`shuffle(5000)` of images puts tens of megabytes into every checkpoint
(measured: 64 MB for a 2.6K-parameter model). Here the bytes are measured in
the saved checkpoint itself (the `ITERATOR_STATE` variant tensors: the data
files' bytes less those of every other tensor, whose sizes the index gives),
and the buffers that hold elements are found in the pipeline's own graph,
by op, with the count and shape of what they hold.
"""

import dataclasses
from typing import List, Optional

import numpy as np
import tensorflow as tf

from trainer import console
from trainer.storage import files

# Above this many bytes of input state a run warns. (Not yet "or above the
# model's weights", as issue 53 suggests: the shipped digits recipe's own
# full shuffle of 1437 examples, 494 KB against 367 KB of weights, would
# warn at every run until its input moves to a global shuffle.)
LARGE_BYTES = 1 << 20
REMEDY_PAGE = "docs/reliability.md#what-a-shuffle-buffer-costs"

# Ops that keep elements between calls, with what they are called in words.
_BUFFERS = {
    "ShuffleDataset": "a shuffle buffer",
    "ShuffleDatasetV2": "a shuffle buffer",
    "ShuffleDatasetV3": "a shuffle buffer",
    "ShuffleAndRepeatDataset": "a shuffle buffer",
    "ShuffleAndRepeatDatasetV2": "a shuffle buffer",
    "CacheDataset": "a cache()",
    "CacheDatasetV2": "a cache()",
    "PrefetchDataset": "a prefetch",
}


# Dataset ops whose iterators TensorFlow 2.20 saves symbolically (positions
# only, with `tf.data.Options().experimental_symbolic_checkpoint`) and
# restores to the same next elements, each tried and pinned by a test. Those
# tried and refused raise UnimplementedError at the first save (`_REFUSED`),
# and a parallel `interleave` restored from a symbolic state hangs in most
# tries: any op not listed keeps it off (`symbolic_blocker`).
SYMBOLIC_OPS = frozenset({
    "AssertCardinalityDataset", "BatchDatasetV2", "ConcatenateDataset",
    "DirectedInterleaveDataset", "FilterDataset", "FlatMapDataset",
    "GlobalShuffleDataset", "InterleaveDataset", "MapDataset",
    "OptionsDataset", "PaddedBatchDatasetV2", "ParallelBatchDataset",
    "ParallelMapDatasetV2", "PrefetchDataset", "RandomDataset",
    "RangeDataset", "RepeatDataset", "ScanDataset", "ShardDataset",
    "ShuffleDatasetV3", "SkipDataset", "TakeDataset", "TakeWhileDataset",
    "TensorDataset", "TensorSliceDataset", "TextLineDataset",
    "TFRecordDataset", "UnbatchDataset", "ZipDataset",
})

# The ops that keep symbolic checkpoints off, as they are written in Python.
_REFUSED = {
    "CacheDatasetV2": "cache()",
    "RebatchDatasetV2": "rebatch()",
    "WindowDataset": "window()",
    "IgnoreErrorsDataset": "ignore_errors()",
    "UniqueDataset": "unique()",
    "GroupByWindowDataset": "group_by_window()",
    "FixedLengthRecordDatasetV2": "FixedLengthRecordDataset",
    "ParallelInterleaveDatasetV4": "interleave(num_parallel_calls=...)",
}


def symbolic_blocker(dataset: tf.data.Dataset) -> Optional[str]:
  """The first op of `dataset`'s pipeline, inner functions included, that
  keeps a symbolic checkpoint of its iterator from working, in words
  (`cache() (CacheDatasetV2)`); None where every op allows it.

  Raises:
    tf.errors.OpError: Where the graph cannot be serialised (Python state,
      as `from_generator` holds: no iterator of it is saved at all).
  """
  graph = _graph(dataset, tf.data.experimental.ExternalStatePolicy.FAIL)
  nodes = list(graph.node) + [node for function in graph.library.function
                              for node in function.node_def]
  for node in nodes:
    if "Dataset" in node.op and node.op not in SYMBOLIC_OPS:
      words = _REFUSED.get(node.op)
      return f"{words} ({node.op})" if words else node.op
  return None


def _graph(dataset: tf.data.Dataset, policy) -> "tf.compat.v1.GraphDef":
  """`dataset`'s pipeline as a GraphDef (tf.data has no public way)."""
  serialized = dataset._as_serialized_graph(  # pylint: disable=protected-access
      external_state_policy=policy)
  return tf.compat.v1.GraphDef.FromString(serialized.numpy())


def checkpoint_bytes(prefix: str) -> Optional[int]:
  """The bytes of input-pipeline state in the checkpoint at `prefix`; None
  if it holds no iterator.

  Variant tensors (a `tf.data` iterator's state) cannot be read back as
  arrays: their size is what the data files hold beyond the other tensors.
  """
  # Not `tf.train.load_checkpoint`: on `ram://` it takes the prefix for a
  # directory and looks for a `checkpoint` file in it.
  reader = tf.compat.v1.train.NewCheckpointReader(prefix)
  dtypes = reader.get_variable_to_dtype_map()
  shapes = reader.get_variable_to_shape_map()
  if not any(dtype == tf.variant for dtype in dtypes.values()):
    return None
  other = 0
  for name, dtype in dtypes.items():
    if dtype == tf.variant:
      continue
    if dtype == tf.string:
      other += sum(len(value) for value in np.ravel(reader.get_tensor(name)))
    else:
      other += int(np.prod(shapes[name], dtype=np.int64)) * dtype.size
  data = sum(files.size(path)
             for path in files.glob(prefix + ".data-*"))
  return max(data - other, 0)


def model_bytes(variables) -> int:
  """The bytes of `variables` (the model's weights)."""
  return sum(int(np.prod(v.shape, dtype=np.int64)) * v.dtype.size
             for v in variables if v.shape.is_fully_defined())


@dataclasses.dataclass(frozen=True)
class Buffer:
  """A pipeline stage that holds elements, as its graph says.

  Attributes:
    kind: In words: "a shuffle buffer", "a cache()", "a prefetch".
    count: Elements it holds at most; None where unbounded or automatic.
    element: The element's dtypes and shapes: `float32[32,32,3], int64[]`.
    element_bytes: Bytes of one element; None where a shape or a string's
      length is not known.
  """
  kind: str
  count: Optional[int]
  element: str
  element_bytes: Optional[int]

  def describe(self) -> str:
    """`a shuffle buffer of 5000 elements (float32[32,32,3], int64[]; 12 KB
    each, 61 MB full)`."""
    count = "automatic size" if self.count is None else (
        f"{self.count} element{'s' if self.count != 1 else ''}")
    size = ""
    if self.element_bytes is not None:
      size = f"; {format_bytes(self.element_bytes)} each"
      if self.count is not None:
        size += f", {format_bytes(self.element_bytes * self.count)} full"
    return f"{self.kind} of {count} ({self.element}{size})"


def buffers(dataset: tf.data.Dataset) -> List[Buffer]:
  """The stages of `dataset`'s pipeline that hold elements (shuffles,
  memory caches, prefetches), from the source to the last stage."""
  graph = _graph(dataset, tf.data.experimental.ExternalStatePolicy.WARN)
  nodes = {node.name: node for node in graph.node}
  found = []
  for node in graph.node:
    kind = _BUFFERS.get(node.op)
    if kind is None:
      continue
    count = _constant(nodes, node.input[1])
    if kind == "a cache()":
      if count not in (b"", None):
        continue  # A cache in files holds nothing in the checkpoint.
      count = None  # The input's filename, not a count: unbounded.
    if not isinstance(count, (int, np.integer)) or count < 0:
      count = None  # Prefetch's AUTOTUNE (-1).
    specs = list(zip(
        (tf.dtypes.as_dtype(dtype)
         for dtype in node.attr["output_types"].list.type),
        (tf.TensorShape(shape)
         for shape in node.attr["output_shapes"].list.shape)))
    found.append(Buffer(kind, None if count is None else int(count),
                        ", ".join(_spec_text(*spec) for spec in specs),
                        _element_bytes(specs)))
  return found


def _spec_text(dtype: tf.DType, shape: tf.TensorShape) -> str:
  """`float32[32,32,3]`, `string[]`, `int64[?]` (`[...]`: rank unknown)."""
  if shape.rank is None:
    return f"{dtype.name}[...]"
  dims = ",".join("?" if d is None else str(d) for d in shape.as_list())
  return f"{dtype.name}[{dims}]"


def _element_bytes(specs) -> Optional[int]:
  """The bytes of an element of `(dtype, shape)` components; None where a
  shape or a string's length is unknown."""
  if not all(shape.is_fully_defined() and dtype not in (tf.string, tf.variant)
             for dtype, shape in specs):
    return None
  return sum(shape.num_elements() * dtype.size for dtype, shape in specs)


def _constant(nodes, name: str):
  """The value of the `Const` node an input names; None if not a const."""
  node = nodes.get(name.split(":")[0].lstrip("^"))
  if node is None or node.op != "Const":
    return None
  value = tf.make_ndarray(node.attr["value"].tensor)
  return value.item() if value.ndim == 0 else None


def format_bytes(count: int) -> str:
  """`812 B`, `13 KB`, `4.1 MB`, `1.2 GB` (powers of 1024)."""
  for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
    if count >= size:
      value = count / size
      return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
  return f"{count} B"


def report(prefix: str, dataset: tf.data.Dataset,
           weights_bytes: int) -> Optional[int]:
  """Says how much input state the checkpoint at `prefix` holds (an
  `input state |` line); warns, naming the buffers, where it is large. Returns
  the bytes (None: no iterator in the checkpoint)."""
  try:
    state = checkpoint_bytes(prefix)
  except (tf.errors.OpError, ValueError) as e:
    # A measurement: it never stops the run it measures.
    console.warning(f"the input state in {prefix} was not measured: "
                    f"{str(e).splitlines()[0]}")
    return None
  if state is None:
    return None
  console.info(f"input state | {format_bytes(state)} in {prefix} (the "
               "training iterator's position and buffers)")
  if state > LARGE_BYTES:
    try:
      holders = buffers(dataset)
    except (tf.errors.OpError, ValueError):
      holders = []  # The warning then names no buffer; the run goes on.
    held = ("; it holds " + ", ".join(b.describe() for b in holders)
            if holders else "")
    console.warning(
        f"the training input's state is {format_bytes(state)} in every "
        f"checkpoint, against {format_bytes(weights_bytes)} of weights"
        f"{held}: every save writes it again. Shuffling in windows or "
        "globally with symbolic checkpointing (`trainer.data.streaming`: "
        f"positions only{_symbolic_note(dataset)}), a smaller shuffle "
        "buffer or prefetch, or `trainer.input_position = \"skip\"` (no "
        "iterator saved; a resume reads the trained batches again) keeps it "
        f"small; see {REMEDY_PAGE}.")
  return state


def _symbolic_note(dataset: tf.data.Dataset) -> str:
  """`; this pipeline's cache() (CacheDatasetV2) prevents it` where an op
  keeps symbolic checkpointing off, else nothing."""
  try:
    blocker = symbolic_blocker(dataset)
  except (tf.errors.OpError, ValueError):
    return ""
  return f"; this pipeline's {blocker} prevents it" if blocker else ""
