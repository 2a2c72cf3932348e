"""Damaged checkpoints: found before a restore trips on them, set aside.

A restore reads optimizer slots (and whatever else a first step creates)
only when they are created: flipped bytes there would fail the first step,
after the restore, and fail it again on every rerun. So `verify` reads
every tensor a restore will read first, which checks every checksum
(measured: 11 to 36 ms for the 3.9 MB checkpoint of the three-model GAN),
and damage anywhere makes the checkpoint one to fall back from
(`checkpoints.restore`). The tensors are read with `RestoreV2`: the
reader of `tf.train.load_checkpoint` cannot read an iterator's variant
state.
"""

import math
import re
from typing import Collection, List, Optional

import tensorflow as tf

from trainer.storage import files

# What the prefix of a checkpoint that could not be restored gets.
DAMAGED = "-damaged"


def set_aside(prefix: str) -> Optional[str]:
  """Renames the files of the damaged checkpoint `prefix` to `<prefix>` +
  `DAMAGED`, where the save of the same step, which a run that fell back
  makes again, does not overwrite them and no cleanup deletes them.

  Returns:
    The new prefix; None if there were no files or that name is taken.
  """
  target = prefix + DAMAGED
  found = files.glob(prefix + ".*")
  if not found or files.glob(target + ".*"):
    return None
  for path in found:
    files.rename(path, target + path[len(prefix):])
  return target


# Bytes of tensors `verify` reads at once: the memory it takes at most.
_VERIFY_BYTES = 64 << 20
# What a checkpoint's key says after a variable's path.
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _restores(name: str, roots: Collection[str]) -> bool:
  """Whether a restore of the objects `roots` reads the tensor `name`: its
  path, and the optimizer's path of a slot, start at one of them."""
  return all(part.split("/")[0] in roots
             for part in name.split("/.OPTIMIZER_SLOT/"))


def verify(path: str, roots: Optional[Collection[str]] = None) -> None:
  """Reads the tensors of checkpoint `path` that a restore of `roots` reads.

  Reading a tensor checks its checksum, which a restore otherwise does for
  an optimizer slot only once the first step creates it.

  Args:
    path: A checkpoint prefix.
    roots: The names of the objects restored from the checkpoint's root
      (`model`, `optimizer`...); None for every tensor.

  Raises:
    tf.errors.DataLossError: If a tensor's bytes do not match their
      checksum, naming the tensor.
    tf.errors.OpError: If the checkpoint cannot be read.
  """
  reader = tf.train.load_checkpoint(path)
  dtypes = reader.get_variable_to_dtype_map()
  shapes = reader.get_variable_to_shape_map()
  names = sorted(name for name in dtypes
                 if roots is None or _restores(name, roots))
  chunks, size = [[]], 0
  for name in names:
    # Strings and variants (an iterator's state) count a byte an element.
    nbytes = max(dtypes[name].size, 1) * math.prod(shapes[name])
    if chunks[-1] and size + nbytes > _VERIFY_BYTES:
      chunks.append([])
      size = 0
    chunks[-1].append(name)
    size += nbytes
  for chunk in chunks:
    try:
      _read(path, chunk, dtypes)
    except tf.errors.DataLossError:
      for name in chunk:  # Which one: read one at a time.
        try:
          _read(path, [name], dtypes)
        except tf.errors.DataLossError as e:
          said = re.sub(r"TensorBundle at \S+ shard (\d+)", r"in shard \1",
                        e.message.split("}} ")[-1].split(" [Op:")[0])
          raise tf.errors.DataLossError(
              None, None, f"{name.removesuffix(_VALUE_SUFFIX)} {said}") from e
      raise


def _read(path: str, names: List[str], dtypes) -> None:
  """Reads the tensors `names` of checkpoint `path` (whatever their type:
  the Python reader cannot read an iterator's variant state)."""
  if names:
    tf.raw_ops.RestoreV2(prefix=path, tensor_names=names,
                         shape_and_slices=[""] * len(names),
                         dtypes=[dtypes[name] for name in names])
