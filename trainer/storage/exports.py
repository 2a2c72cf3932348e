"""SavedModel export for serving, written atomically.

An export is a serving SavedModel: the task's signatures and the model's
weights, in the TF Serving layout `<base>/<step>/`. It is saved from a plain
`tf.Module` holding the weights, not through Keras' model serialisation: that
is faster, and works for any model whose call can be traced.
"""

import dataclasses
import os
from typing import Callable, Dict, Optional

import gin
import tensorflow as tf

from trainer import errors
from trainer.storage import files

# Signature name -> a `tf.function` with an input signature, or a concrete
# function.
Signatures = Dict[str, Callable]


@gin.configurable("export")
@dataclasses.dataclass(frozen=True)
class ExportConfig:
  """When SavedModels are written, bound as `export.<name>`.

  Attributes:
    at_end: Export when training ends, to `model_dir/export/<step>/`.
    best: Export each new best checkpoint (`best_checkpoint.*`) to
      `model_dir/best/export/<step>/`, replacing the previous best export.
    model: With several models (`trainer.model.named`), the one exported.
  """
  at_end: bool = False
  best: bool = False
  model: Optional[str] = None


def default_signatures(model, features_spec) -> Signatures:
  """Returns `serving_default`: the model's inference call on a batch.

  Args:
    model: The model to serve.
    features_spec: The features' `tf.TensorSpec` (or a dict of them), with
      any batch size.

  Raises:
    errors.ConfigTypeError: For features that are neither a tensor nor a
      dict of tensors (override `Task.export_signatures`); a `TypeError`.
  """

  def outputs(features):
    result = model(features, training=False)
    # Served as named float32 tensors, whatever the compute precision.
    result = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), result)
    return result if isinstance(result, dict) else {"outputs": result}

  if isinstance(features_spec, tf.TensorSpec):
    spec = tf.TensorSpec(features_spec.shape, features_spec.dtype,
                         name="features")
    serve = tf.function(outputs, input_signature=[spec])
  elif isinstance(features_spec, dict) and all(
      isinstance(s, tf.TensorSpec) for s in features_spec.values()):

    def serve_named(**features):
      return outputs(features)

    # A signature's inputs are flat keyword tensors, one per feature.
    serve = tf.function(serve_named).get_concrete_function(**{
        name: tf.TensorSpec(s.shape, s.dtype, name=name)
        for name, s in features_spec.items()})
  else:
    raise errors.ConfigTypeError(
        "the default serving signature takes a tensor or a dict of tensors; "
        f"these features are {features_spec}: override "
        "`Task.export_signatures`.")
  return {"serving_default": serve}


def export(model, signatures: Signatures, directory: str) -> str:
  """Writes a serving SavedModel of `model` to `directory` whole
  (`files.write_directory`: locally renamed into place, on a URL marked
  complete last).

  Returns:
    `directory`.
  """
  root = tf.Module()
  # Tracking the weights (not the Keras model) saves them as plain
  # variables, which the signatures capture.
  root.weights = list(model.weights)
  concrete = {name: fn.get_concrete_function() if hasattr(
      fn, "get_concrete_function") else fn
              for name, fn in signatures.items()}
  for name, fn in concrete.items():
    setattr(root, f"signature_{name}", fn)

  def fill(temporary):
    tf.saved_model.save(root, temporary, signatures=concrete)

  files.write_directory(directory, fill)
  return directory


def keep_newest(base: str, keep: int) -> None:
  """Deletes all but the `keep` highest-numbered complete exports in `base`,
  and every incomplete one (on a URL, an export a crash cut short:
  `files.complete`)."""
  exported = sorted((int(name), os.path.join(base, name))
                    for name in files.listdir(base) if name.isdigit())
  whole = [path for _, path in exported if files.complete(path)]
  kept = whole[-keep:] if keep else []
  for _, path in exported:
    if path not in kept:
      files.rmtree(path)
