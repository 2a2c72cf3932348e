"""Training mixtures: several named training datasets mixed by rates.

A Task's `build_inputs(training=True)` may return a dict of datasets by
name instead of one dataset; `trainer.mixture` (or the Task's
`mixture_rates` hook) gives each its rate. The examples are mixed one by
one by tf.data's own `tf.data.Dataset.choose_from_datasets`, given each
example's source drawn at the rates (seeded from `runtime.seed` and the
input pipeline), and batched as one dataset would be.

Each example travels with the index of its source (a second component the
framework strips before the Task sees the batch): the train summaries count
the sources' shares of the examples trained on from it. Because the index
is part of the pipeline, not a side channel, everything that resumes one
dataset resumes a mixture: the checkpointed iterator holds the sampler's
position and every source's, and a rebuilt pipeline skipped by as many
batches draws the same sequence.
"""

import dataclasses
import math
import re
from typing import Dict, Mapping, Optional, Tuple

import tensorflow as tf

from trainer import checks
from trainer import errors

# What a source that runs out does: starts over on its own ("repeat": the
# rates hold for ever), or ends the mixture's epoch ("end": the whole
# mixture starts over, with a new draw, as one dataset's epoch would).
EXHAUSTION = ("repeat", "end")

# Sources drawn at once (per block, one op): a draw's cost per example.
_BLOCK = 1024

# A source's name becomes part of a summary tag (`mixture/<name>`).
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_rates(rates, where: str = "trainer.mixture") -> Dict[str, float]:
  """Returns `rates` as floats by name, checked.

  Raises:
    errors.ConfigError: For no mapping, a name that cannot be a summary
      tag, a rate that is not a finite number >= 0, or rates summing to 0.
  """
  if not isinstance(rates, Mapping) or not rates:
    raise errors.ConfigError(
        f"`{where}` ({rates!r}) must map each training source's name to its "
        'rate, e.g. {"clean": 0.7, "noisy": 0.3}.')
  checked = {}
  for name, rate in rates.items():
    checks.require(
        isinstance(name, str) and bool(_NAME.match(name)),
        f"`{where}` names a source {name!r}: a source's name must be letters, "
        "digits, `_`, `.` or `-` (it becomes the summary tag "
        "`mixture/<name>`).")
    checks.require(
        checks.is_number(rate) and math.isfinite(rate) and rate >= 0,
        f"`{where}` gives {name!r} the rate {rate!r}: a rate must be a "
        "number >= 0 (0 leaves the source out).")
    checked[name] = float(rate)
  checks.require(
      sum(checked.values()) > 0,
      f"`{where}` rates sum to 0: give at least one source a positive rate.")
  return checked


@dataclasses.dataclass(frozen=True)
class Mixture:
  """The rates of a Task's training sources, and how they are mixed.

  Attributes:
    rates: Source name -> rate (any positive scale; each source's share is
      its rate over their sum), in the order given.
    where: What gave the rates (`trainer.mixture` or the Task's hook), for
      error messages.
    exhausted: What a finite source that runs out does (`EXHAUSTION`).
    seed: Seeds the sampler (`runtime.seed`, 0 where unset).
  """
  rates: Dict[str, float]
  where: str = "trainer.mixture"
  exhausted: str = "repeat"
  seed: int = 0

  def __post_init__(self):
    object.__setattr__(self, "rates", check_rates(self.rates, self.where))
    checks.choice("trainer.mixture_exhausted", self.exhausted, EXHAUSTION)

  @property
  def names(self) -> Tuple[str, ...]:
    """The sources' names, in the order of `rates`."""
    return tuple(self.rates)

  @property
  def shares(self) -> Dict[str, float]:
    """Each source's expected share of the examples: its rate over their
    sum."""
    total = sum(self.rates.values())
    return {name: rate / total for name, rate in self.rates.items()}

  def describe(self) -> str:
    """One line: the sources and their shares, and what exhaustion does."""
    shares = ", ".join(f"{name} {share:.3g}"
                       for name, share in self.shares.items())
    ends = ("a source that runs out starts over" if self.exhausted == "repeat"
            else "the mixture starts over when a source runs out")
    return f"mixture | {shares} (from `{self.where}`; {ends})"

  def tags(self) -> Dict[str, str]:
    """Source name -> the train summary tag of its share."""
    return {name: f"mixture/{name}" for name in self.names}

  def mix(self, sources, task_name: str, pipeline_id: int = 0
          ) -> tf.data.Dataset:
    """Returns the mixed examples of `sources`, each as `(example, index of
    its source in names)`.

    Args:
      sources: What `build_inputs(training=True)` returned: name -> dataset
        of single examples.
      task_name: The Task's class name, for error messages.
      pipeline_id: This input pipeline's id: pipelines draw apart.

    Raises:
      errors.ConfigError: If `sources` is not a dict of datasets with the
        names of `rates`, a source is known to be empty, or the sources'
        examples differ in structure.
    """
    hook = f"{task_name}.build_inputs(training=True)"
    if not isinstance(sources, Mapping):
      raise errors.ConfigError(
          f"`{self.where}` gives rates ({', '.join(self.names)}), but {hook} "
          f"returns one {type(sources).__name__}, not a dict of datasets by "
          "name.")
    for name in self.names:
      checks.require(
          name in sources,
          f"`{self.where}` gives a rate to {name!r}, which {hook} does not "
          f"return (it returns: {', '.join(map(str, sources))}).")
    for name in sources:
      checks.require(
          name in self.rates,
          f"{hook} returns {name!r}, which has no rate in `{self.where}` "
          f"(it gives: {', '.join(self.names)}); give every source a rate "
          "(0 leaves one out).")
    first = None
    chosen = []
    for name in self.names:
      source = sources[name]
      if not isinstance(source, tf.data.Dataset):
        raise errors.ConfigTypeError(
            f"{hook}[{name!r}] must be a `tf.data.Dataset`, got "
            f"{type(source).__name__}.")
      if first is None:
        first = (name, source.element_spec)
      elif not _same_structure(first[1], source.element_spec):
        raise errors.ConfigError(
            f"{hook}: the examples of {name!r} ({source.element_spec}) differ "
            f"from those of {first[0]!r} ({first[1]}); every source must give "
            "examples of one structure and dtype.")
      if (self.rates[name] > 0 and tf.executing_eagerly() and
          int(source.cardinality()) == 0):
        raise errors.ConfigError(
            f"the training source {name!r} is empty (its rate is "
            f"{self.rates[name]:g}).")
      # A source of rate 0 is never chosen, so never read.
      chosen.append(source.repeat() if self.exhausted == "repeat"
                    else source)
    mixed = tf.data.Dataset.choose_from_datasets(
        chosen, self._choices(pipeline_id, tf.int64),
        stop_on_empty_dataset=True)
    # The same draw again, for the summaries: each example's source.
    return tf.data.Dataset.zip((mixed, self._choices(pipeline_id, tf.int32)))

  def _choices(self, pipeline_id: int, dtype: tf.DType) -> tf.data.Dataset:
    """Returns the index of each example's source, drawn at the rates.

    Drawn a block at a time (one `stateless_categorical` call), each block
    seeded by the seed, the pipeline and its own index: the sequence depends
    on nothing else, so two copies of it agree, a checkpoint holds its
    position in one counter, and a rebuilt pipeline skipped by n batches
    draws what the saved one did. (tf.data's `sample_from_datasets` draws
    each example with its own ops: its pipeline ran at a tenth of the speed
    of one dataset's here, measured; so did a `map` per example.)
    """
    logits = tf.math.log(tf.constant([list(self.rates.values())],
                                     tf.float32))
    seed, block = self.seed, _BLOCK

    def draw(index):
      return tf.random.stateless_categorical(
          logits, block, seed=tf.stack([tf.constant(seed, tf.int64),
                                        pipeline_id * (2**32) + index]),
          dtype=dtype)[0]

    return tf.data.Dataset.counter().map(draw).unbatch()


def _same_structure(a, b) -> bool:
  """Whether two element specs nest alike with the same dtypes (shapes may
  differ where a dimension is unknown)."""
  try:
    tf.nest.assert_same_structure(a, b)
  except (ValueError, TypeError):
    return False
  return all(x.dtype == y.dtype and x.shape.is_compatible_with(y.shape)
             if isinstance(x, tf.TensorSpec) else type(x) is type(y)
             for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)))


def for_task(task, config, runtime) -> Optional[Mixture]:
  """The Task's training mixture: `trainer.mixture`, else the Task's
  `mixture_rates()`; None where neither gives rates.

  Args:
    task: May define `mixture_rates()`.
    config: A `trainer.TrainerConfig` (`mixture`, `mixture_exhausted`).
    runtime: A `trainer.RuntimeConfig` (`seed`).
  """
  rates, where = config.mixture, "trainer.mixture"
  if rates is None:
    rates = task.mixture_rates()
    where = f"{type(task).__name__}.mixture_rates"
  if rates is None:
    return None
  return Mixture(rates, where=where, exhausted=config.mixture_exhausted,
                 seed=runtime.seed or 0)
