"""Naming the damaged file behind a `DataLossError` of an input pipeline.

TensorFlow's TFRecord reader says what is wrong and where, but not in which
file: `truncated record at 1245022' failed with Read less bytes than
requested` (measured; with many shards a user cannot find the bad one).
`describe` finds it: the file names an input pipeline reads are constants of
its dataset graph (the list `from_tensor_slices` or `list_files` made), and
the damaged one is the file where a record starts at that byte offset and,
for a truncated record, runs past the end. Only the records' 12-byte headers
are read (length and its checksum), seeking over their data, so even large
shards are checked in seconds; this runs only after the error.

A `DataLossError` in a loop may also come from a checkpoint: a restore
reads optimizer slots when the first step creates them. Its message names
the checkpoint (`TensorBundle at <prefix> shard 0`), and so does the line:
a checkpoint is never called input data.
"""

import re
import struct
from typing import Iterator, List, Optional

import tensorflow as tf

from trainer import user_errors
from trainer.storage import files

_OFFSET = re.compile(r"(truncated|corrupted) record at (\d+)")
_BUNDLE = re.compile(r"TensorBundle at (\S+) shard \d+")
_HEADER = 12  # Record length (8 bytes) and its masked CRC (4 bytes).
_FOOTER = 4  # The data's masked CRC.
_MAX_NAMED = 3


def _string_constants(graph: tf.compat.v1.GraphDef) -> Iterator[bytes]:
  """Every string in the constants of `graph` and its functions."""
  nodes = list(graph.node)
  for function in graph.library.function:
    nodes += function.node_def
  for node in nodes:
    if node.op != "Const" or "value" not in node.attr:
      continue
    proto = node.attr["value"].tensor
    if proto.dtype != tf.string.as_datatype_enum:
      continue
    values = tf.io.parse_tensor(proto.SerializeToString(), tf.string)
    yield from tf.reshape(values, [-1]).numpy()


def _is_file(name: str) -> bool:
  """Whether the string `name` is the path of a file (local or a URL)."""
  try:
    return files.isfile(name)
  # A string such as `http://...`, of a scheme TensorFlow has no file
  # system for, is no file here.
  except tf.errors.OpError:
    return False


def files_read(dataset: tf.data.Dataset) -> List[str]:
  """The existing files named by `dataset`'s constants, in order."""
  graph = tf.compat.v1.GraphDef()
  graph.ParseFromString(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
  found = []
  for value in _string_constants(graph):
    name = value.decode("utf-8", "replace")
    if name not in found and _is_file(name):
      found.append(name)
  return found


def _record_at(path: str, offset: int) -> Optional[bool]:
  """Walks `path`'s record headers: None if no record starts at `offset`,
  else whether the record there runs past the file's end."""
  size = files.size(path)
  position = 0
  with files.open_file(path, "rb") as f:
    while position < offset:
      f.seek(position)
      header = f.read(_HEADER)
      if len(header) < _HEADER:
        return None
      length = struct.unpack("<Q", header[:8])[0]
      position += _HEADER + length + _FOOTER
    if position != offset:
      return None
    f.seek(offset)
    header = f.read(_HEADER)
    if len(header) < _HEADER:
      return True
    length = struct.unpack("<Q", header[:8])[0]
    return offset + _HEADER + length + _FOOTER > size


def describe(error: tf.errors.DataLossError,
             dataset: Optional[tf.data.Dataset]) -> str:
  """Returns one line naming the damaged input file behind `error`, where
  `dataset`'s files show which one, and TensorFlow's words otherwise; or
  the damaged checkpoint, where `error` names one."""
  said = user_errors.cause(error).removeprefix("DataLossError: ")
  said = re.sub(r"\s*name:\s*$", "", said)
  bundle = _BUNDLE.search(said)
  if bundle:
    return (f"checkpoint {bundle.group(1)} is damaged ({said}); run the same "
            "command again to restore the one before it")
  found = _OFFSET.search(said)
  suspects = []
  if found and dataset is not None:
    kind, offset = found.group(1), int(found.group(2))
    # A truncated record's offset is where it starts; a corrupted one's
    # where its header (a bad length) or its data (a bad checksum) is.
    starts = [offset] if kind == "truncated" else [offset, offset - _HEADER]
    for path in files_read(dataset):
      for start in starts:
        runs_past = _record_at(path, start)
        if runs_past is not None and (kind != "truncated" or runs_past):
          suspects.append(path)
          break
  if not suspects:
    return (f"the input data is damaged: {said}; which file could not be "
            "told from the pipeline: check the files the Task reads")
  if len(suspects) == 1:
    where = f"{suspects[0]} holds a {kind} record at byte {offset}"
  else:
    named = ", ".join(suspects[:_MAX_NAMED])
    more = len(suspects) - _MAX_NAMED
    where = (f"one of {named}{f' (and {more} more)' if more > 0 else ''} "
             f"holds a {kind} record at byte {offset}")
  return (f"the input data is damaged: {where} ({said}); replace or remove "
          "that file and run the same command again to resume from the "
          "newest checkpoint")
