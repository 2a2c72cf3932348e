"""Keras 3 beside tf_keras: what a model file or object was made with, and
the one line that refuses Keras 3.

TensorFlow 2.20 installs Keras 3 as `keras` and `tf.keras` unless
`TF_USE_LEGACY_KERAS=1` (which `import trainer` sets) selects tf_keras, the
Keras 2 that Model Garden, Orbit and this framework are built on. The two do
not mix (measured with tf_keras 2.20.1 and Keras 3.15.1):

- tf_keras cannot load a `.keras` or `.h5` file saved by Keras 3 (its
  `InputLayer` config has `batch_shape` and `optional`, its functional
  graph another node format), nor a Keras 3 `model.export` SavedModel (no
  `keras_metadata.pb`: `load_model` fails on a bare `_UserObject`).
- A Keras 3 model object is no `tf_keras.Model`: the framework's optimizers,
  losses, metrics, checkpoints and checks are tf_keras's.
- What works: the same architecture built with tf_keras, given the Keras 3
  model's weights in order (`get_weights()`, read by Keras 3 itself): the
  outputs are bit-identical, under MirroredStrategy too
  (`KerasModelTask.initial_weights`).
"""

import inspect
import json
import os
import sys
import zipfile
from typing import Any, Optional

from trainer import errors
from trainer.storage import files

ROUTE = ("build the same architecture with tf_keras in a model function "
         "(`KerasModelTask.model = @my_model`: `import tf_keras as keras`, "
         "or `tf.keras` after `import trainer`) and start from its weights "
         "with `KerasModelTask.initial_weights = \"{file}\"`")


def is_keras3(value: Any) -> bool:
  """Whether `value` (an object, class or function) comes from Keras 3's
  `keras` package, not tf_keras."""
  origin = value if inspect.isclass(value) or inspect.isroutine(value) else (
      type(value))
  module = getattr(origin, "__module__", None) or ""
  if module.split(".")[0] != "keras":
    return False
  return major(getattr(sys.modules.get("keras"), "__version__", "3")) >= 3


def major(version: str) -> int:
  """3 for "3.15.1"; 0 where it is no version."""
  head = version.split(".")[0]
  return int(head) if head.isdigit() else 0


def refuse_keras3(setting: str, value: Any, file: str = "model.keras"
                  ) -> None:
  """Raises the one-line refusal where `value` is from Keras 3.

  Raises:
    errors.ConfigError: Saying it is Keras 3 and the route that works.
  """
  if not is_keras3(value):
    return
  origin = value if inspect.isclass(value) or inspect.isroutine(value) else (
      type(value))
  name = f"{origin.__module__}.{origin.__qualname__}"
  raise errors.ConfigError(
      f"`{setting}` is Keras 3 ({name}), which this framework (tf_keras, "
      f"Keras 2) cannot train: {_route_for(setting, file)}.")


def _route_for(setting: str, file: str) -> str:
  if setting.endswith((".loss", ".metrics")):
    return ("name it as a string (`\"sparse_categorical_crossentropy\"`) or "
            "give tf_keras's (`tf_keras.losses`, `tf_keras.metrics`)")
  return ROUTE.format(file=file)


def saved_by(path: str) -> Optional[str]:
  """The Keras version that wrote a model file, as the file records it:
  `metadata.json` of a `.keras` zip, the `keras_version` attribute of an
  HDF5 file; "2" for a SavedModel holding a tf_keras model
  (`keras_metadata.pb`), "" for a SavedModel without one; None where the
  file says nothing (or is no model file: tf_keras's load then says why).
  """
  if files.isdir(path):
    if not files.exists(os.path.join(path, "saved_model.pb")):
      return None
    return ("2" if files.exists(os.path.join(path, "keras_metadata.pb"))
            else "")
  try:
    with files.open_file(path, "rb") as f:
      head = f.read(8)
      f.seek(0)
      if head.startswith(b"PK"):
        with zipfile.ZipFile(f) as archive:
          return str(json.loads(archive.read("metadata.json"))
                     ["keras_version"])
      if head == b"\x89HDF\r\n\x1a\n":
        import h5py  # pylint: disable=g-import-not-at-top
        with h5py.File(f, "r") as h5:
          version = h5.attrs.get("keras_version")
          return version.decode() if isinstance(version, bytes) else (
              None if version is None else str(version))
  except (OSError, KeyError, ValueError, zipfile.BadZipFile):
    return None
  return None


def check_model_file(setting: str, path: str) -> None:
  """Checks a model file before anything is built.

  Raises:
    errors.ConfigError: For a path that does not exist, a file saved by
      Keras 3 (with the route that works), a SavedModel without a Keras
      model in it.
  """
  if not files.exists(path):
    raise errors.ConfigError(f"`{setting}` ({path}) does not exist.")
  version = saved_by(path)
  if version == "":
    raise errors.ConfigError(
        f"`{setting}` ({path}) is a SavedModel with no Keras model in it (no "
        "keras_metadata.pb: written by Keras 3's `model.export` or "
        "`tf.saved_model.save`), which cannot be trained: give the model's "
        "`.keras` file (saved by Keras 3: see `KerasModelTask."
        "initial_weights`) or a tf_keras `model.save(...)`.")
  if version and major(version) >= 3:
    raise errors.ConfigError(
        f"`{setting}` ({path}) was saved by Keras {version} (Keras 3), which "
        f"tf_keras cannot load: {ROUTE.format(file=path)}.")
