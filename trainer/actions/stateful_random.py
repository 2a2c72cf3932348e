"""Warning about stateful random ops a resumed run cannot replay: a train
action."""

from typing import Any, Callable, List

from trainer import console


# Random ops whose state no checkpoint holds.
STATEFUL_RANDOM_OPS = frozenset([
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal",
    "TruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomCrop"])


def stateful_random_ops(traced) -> List[str]:
  """Returns `"OpType (node name)"` for each stateful random op in `traced`.

  Ops such as `RandomUniform` (`tf.random.uniform`, tf_keras `Dropout`)
  keep their state outside any checkpoint, so a resumed run draws other
  numbers than an uninterrupted one. Stateless ops seeded from the step
  (`tf.random.stateless_*`) resume exactly.

  Args:
    traced: A concrete function (`TaskTrainer.traced_loop()`), or None.
  """
  if traced is None:
    return []
  graph = traced.graph.as_graph_def()
  nodes = list(graph.node) + [node for function in graph.library.function
                              for node in function.node_def]
  return sorted({f"{node.op} ({node.name})" for node in nodes
                 if node.op in STATEFUL_RANDOM_OPS})


class StatefulRandomCheck:
  """Train action: after the first loop, warns about stateful random ops.

  Only with `runtime.deterministic`, where the user asked for exactness.
  """

  def __init__(self, trace_fn: Callable[[], Any], enabled: bool):
    """`trace_fn` returns the traced training loop (or None)."""
    self._trace_fn = trace_fn
    self._done = not enabled

  def __call__(self, unused_output) -> None:
    if self._done:
      return
    self._done = True
    found = stateful_random_ops(self._trace_fn())
    if found:
      console.warning(
          "runtime.deterministic: the train step uses stateful random ops "
          f"({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}); "
          "their state is not checkpointed, so a resumed run will differ. "
          "Use tf.random.stateless_* ops seeded from the step.")
