"""The framework's own step code is written for graphs: autograph need not
convert it.

Inside a `tf.function`, autograph rewrites every Python function it meets
into graph code, and the rewriting is the dearest part of a first trace:
about 1.7 s of a 1-step digits run's 2.2 s first train call went to
converting some twenty of the framework's functions, which branch only on
Python values (the step's own `for` and `if` over tensors live in the
training loop, which is still converted). `written_for_graphs` marks such a
function: autograph calls it as written, so the graph it builds is the same
op for op. Autograph stays enabled inside it: what it calls that autograph
would convert on its own (a subclassed Keras model's `call`, the function
given to `strategy.run`) still is; a Task's hook it calls directly, which
the user may have written with Python `if`s over tensors, it calls through
`user_code`, converted as before.
"""

from typing import Callable, TypeVar

import tensorflow as tf
# pylint: disable-next=g-direct-tensorflow-import
from tensorflow.python.autograph.impl import api as autograph_api

Function = TypeVar("Function", bound=Callable)


def written_for_graphs(function: Function) -> Function:
  """Marks `function` (of the framework, branching on Python values only)
  to be called by autograph as written, not converted; returns it."""
  autograph_api.autograph_artifact(function)
  return function


def user_code(function: Function) -> Function:
  """Returns `function` as autograph would call it from converted code: a
  Task's hook the user may have written, converted where autograph is on
  (tracing a `tf.function`), as it is elsewhere (running eagerly), and one
  marked `written_for_graphs` (the framework's default hook) as it is."""
  return tf.__internal__.autograph.tf_convert(
      function, tf.__internal__.autograph.control_status_ctx(),
      convert_by_default=False)
