"""Training mixtures: several named training datasets mixed by rates.

A Task's `build_inputs(training=True)` may return a dict of datasets by
name instead of one dataset; `trainer.mixture` (or the Task's
`mixture_rates` hook) gives each its rate. The examples are mixed one by
one by tf.data's own `tf.data.Dataset.choose_from_datasets`, given each
example's source drawn at the rates (seeded from `runtime.seed` and the
input pipeline), and batched as one dataset would be.

Each example travels with the index of its source (a second component the
framework strips before the Task sees the batch): the train summaries count
the sources' shares of the examples trained on from it, and, where the
step returns its per-example losses, each source's mean loss
(`trainer.loop.runner.source_shares`). Because the index
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
    schedule: Rates over steps: step -> the rates from that step on,
      interpolated linearly between two steps (`check_schedule`); `rates`
      are then the first step's. None: `rates` hold throughout.
    examples_per_step: The examples a step reads from this input pipeline
      (its share of the global batch), which a schedule's steps count in.
  """
  rates: Dict[str, float]
  where: str = "trainer.mixture"
  exhausted: str = "repeat"
  seed: int = 0
  schedule: Optional[Dict[int, Dict[str, float]]] = None
  examples_per_step: int = 1

  def __post_init__(self):
    object.__setattr__(self, "rates", check_rates(self.rates, self.where))
    checks.choice("trainer.mixture_exhausted", self.exhausted, EXHAUSTION)
    if self.schedule is not None:
      object.__setattr__(self, "schedule", check_schedule(self.schedule))
      checks.require(
          self.exhausted == "repeat",
          "`trainer.mixture_schedule` needs `trainer.mixture_exhausted = "
          '"repeat"`: with "end" every epoch of the mixture would start its '
          "schedule over.")

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
    """The sources and their shares, and what exhaustion does (the text of
    the `mixture |` line)."""
    shares = ", ".join(f"{name} {share:.3g}"
                       for name, share in self.shares.items())
    ends = ("a source that runs out starts over" if self.exhausted == "repeat"
            else "the mixture starts over when a source runs out")
    if self.schedule is not None:
      steps = list(self.schedule)
      shares = ", ".join(
          f"{name} " + " -> ".join(f"{rates[name] / sum(rates.values()):.3g}"
                                   for rates in self.schedule.values())
          for name in self.names)
      return (f"{shares} at steps "
              f"{', '.join(map(str, steps))} (from "
              f"`trainer.mixture_schedule`; {ends})")
    return f"{shares} (from `{self.where}`; {ends})"

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
    seed, block = self.seed, _BLOCK
    logits_at = self._logits_at()

    def draw(index):
      return tf.random.stateless_categorical(
          logits_at(index), block,
          seed=tf.stack([tf.constant(seed, tf.int64),
                         pipeline_id * (2**32) + index]), dtype=dtype)[0]

    return tf.data.Dataset.counter().map(draw).unbatch()


  def _logits_at(self):
    """Returns `block index -> logits [1, sources]` of the rates there: the
    rates, or the schedule's at the step the block starts in."""
    if self.schedule is None:
      logits = tf.math.log(tf.constant([list(self.rates.values())],
                                       tf.float32))
      return lambda index: logits
    steps = tf.constant(list(self.schedule), tf.float64)
    shares = tf.constant(
        [[rates[name] / sum(rates.values()) for name in self.names]
         for rates in self.schedule.values()], tf.float64)
    last = len(self.schedule) - 1
    per_step = self.examples_per_step

    def logits_at(index):
      step = tf.cast(index * _BLOCK // per_step, tf.float64)
      after = tf.searchsorted(steps, step[None], side="right")[0]
      low = tf.clip_by_value(after - 1, 0, last)
      high = tf.clip_by_value(after, 0, last)
      span = tf.gather(steps, high) - tf.gather(steps, low)
      weight = tf.where(span > 0, (step - tf.gather(steps, low)) /
                        tf.maximum(span, 1.0), 0.0)
      now = (tf.gather(shares, low) * (1.0 - weight) +
             tf.gather(shares, high) * weight)
      return tf.math.log(tf.cast(now, tf.float32))[None]

    return logits_at


def check_schedule(schedule) -> Dict[int, Dict[str, float]]:
  """Returns `trainer.mixture_schedule` checked, its steps in order.

  Raises:
    errors.ConfigError: For steps that are not integers >= 0 or lack 0,
      rates that `check_rates` refuses, or steps naming other sources.
  """
  where = "trainer.mixture_schedule"
  checks.require(
      isinstance(schedule, Mapping) and bool(schedule),
      f"`{where}` ({schedule!r}) must map steps to the rates from there on, "
      'e.g. {0: {"clean": 1.0, "noisy": 0.0}, 1000: {"clean": 0.7, '
      '"noisy": 0.3}}.')
  for step in schedule:
    checks.require(checks.is_int(step) and step >= 0,
                   f"`{where}` has the step {step!r}: steps must be integers "
                   ">= 0.")
  checks.require(0 in schedule,
                 f"`{where}` must give the rates at step 0 (it starts at "
                 f"step {min(schedule)}).")
  checked = {step: check_rates(schedule[step], f"{where}[{step}]")
             for step in sorted(schedule)}
  names = set(checked[0])
  for step, rates in checked.items():
    checks.require(
        set(rates) == names,
        f"`{where}[{step}]` names {', '.join(sorted(rates))}; step 0 names "
        f"{', '.join(sorted(names))}: every step gives every source a rate.")
  return checked


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


def for_task(task, config, runtime, examples_per_step: int = 1
             ) -> Optional[Mixture]:
  """The Task's training mixture: `trainer.mixture_schedule`, else
  `trainer.mixture`, else the Task's `mixture_rates()`; None where none
  gives rates.

  Args:
    task: May define `mixture_rates()`.
    config: A `trainer.TrainerConfig` (`mixture`, `mixture_schedule`,
      `mixture_exhausted`).
    runtime: A `trainer.RuntimeConfig` (`seed`).
    examples_per_step: What a step reads from one input pipeline.
  """
  rates, where = config.mixture, "trainer.mixture"
  schedule = config.mixture_schedule
  if schedule is not None:
    return Mixture(schedule[0], where="trainer.mixture_schedule[0]",
                   exhausted=config.mixture_exhausted, seed=runtime.seed or 0,
                   schedule=schedule, examples_per_step=examples_per_step)
  if rates is None:
    rates = task.mixture_rates()
    where = f"{type(task).__name__}.mixture_rates"
  if rates is None:
    return None
  return Mixture(rates, where=where, exhausted=config.mixture_exhausted,
                 seed=runtime.seed or 0)
