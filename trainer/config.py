"""`TrainerConfig`: the loop's settings, bound in gin as `trainer.<name>`.

The features around the loop have small configurables of their own, each
bound under its own name and held here as one field: `optimizer.*`,
`learning_rate.*`, `ema.*` (`trainer.model.optimization`), `warm_start.*`
(`trainer.model.warm_start`), `export.*` (`trainer.storage.exports`),
`best_checkpoint.*` and `early_stopping.*` (`trainer.actions`), `pipeline.*`
(`trainer.distribute.pipeline`). Every value is checked when the
configuration is built, before TensorFlow starts.
"""

import dataclasses
from typing import Any, Dict, Optional, Tuple

import gin

from trainer import actions
from trainer import checks
from trainer.actions import keras_callbacks
from trainer.data import eval_sets as eval_sets_lib
from trainer.data import mixture as mixture_lib
from trainer.distribute import pipeline as pipeline_lib
from trainer.loop.control import profiler
from trainer.loop.control import rollback
from trainer.model import ema as ema_lib
from trainer.model import optimization
from trainer.model import optimizer_parts as optimizer_parts_lib
from trainer.model import scaling
from trainer.model import warm_start as warm_start_lib
from trainer.storage import exports

INPUT_POSITIONS = ("checkpoint", "skip", "restart")


def _bound(configurable):
  """A field built by calling `configurable`, which applies its bindings."""
  return dataclasses.field(default_factory=configurable)


@gin.configurable("trainer")
@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """Loop, evaluation and checkpoint settings, bound as `trainer.<name>`.

  Attributes:
    train_steps: Train until the global step reaches this.
    steps_per_loop: Steps run inside one `tf.function` call; progress is
      reported once per loop.
    global_batch_size: Training examples per step over all replicas (and
      micro-batches): what one optimizer update sees.
    eval_batch_size: Evaluation examples per step over all replicas.
    validation_steps: Eval batches per evaluation; -1 is one full pass over
      the eval split, partial last batch included. With named evaluation
      sets, one count for every set, or a dict of counts by set name
      (`{"clean": 10}`; a set it does not name gets a full pass).
    validation_interval: Evaluate at every multiple of this step in
      `train_and_eval`; 0 evaluates only at the end.
    checkpoint_interval: Save when the step reaches a multiple of this; a
      checkpoint is always saved when training ends.
    summary_interval: Write train summaries every this many steps; a multiple
      of `steps_per_loop`. The learning rate is written every loop.
    max_to_keep: Newest checkpoints kept.
    keep_until_evaluated: Delete a checkpoint beyond `max_to_keep` only once
      a `continuous_eval` process has evaluated it (it records the steps it
      evaluated in `model_dir/eval/evaluated.json`; with named evaluation
      sets, once every set is evaluated).
    continuous_eval_timeout: `continuous_eval` gives up after waiting this
      many seconds for a new checkpoint.
    eval_sets: The named evaluation sets every evaluation evaluates (of
      every mode), e.g. `("clean",)`; None: all the sets the Task returns.
    held_out_sets: Named evaluation sets that are evaluated and reported
      but never judged (a test set): `best_checkpoint.metric`,
      `early_stopping.metric` and a sweep's `--metric` may not name their
      results.
    input_position: How a restarted run finds its place in the training
      input. "checkpoint": the iterator is in the checkpoint (exact; with
      several workers each saves its own beside it, in `input/` of
      model_dir; where it cannot be saved, "skip" instead); "skip": the
      batches trained on are read again and thrown away (exact; the cost
      grows with the step); "restart": the input starts over (not exact).
      A run resumed with another
      `global_batch_size` skips the examples trained on before in batches
      of the new size ("checkpoint" and "skip"; the checkpointed iterator
      gives batches of the old size), and says so in an `input |` line.
    mixture: Training sources by name -> their rates, where the Task's
      `build_inputs(training=True)` returns a dict of datasets, e.g.
      `{"clean": 0.7, "noisy": 0.3}`: each source's share of the examples
      is its rate over their sum, drawn example by example, seeded from
      `runtime.seed`; None takes the Task's `mixture_rates()`.
    mixture_schedule: The rates of a mixture over steps, in place of
      `mixture`: step -> the rates there, e.g. `{0: {"clean": 1.0, "noisy":
      0.0}, 1000: {"clean": 0.7, "noisy": 0.3}}`; between two steps each
      source's share moves linearly, after the last it stays. It starts at
      step 0, changes every 1,024 examples of an input pipeline, and needs
      `mixture_exhausted = "repeat"`.
    mixture_exhausted: What a finite source of a mixture does when it runs
      out: "repeat" (it starts over alone; the rates hold) or "end" (the
      mixture's epoch ends and the whole mixture starts over).
    gradient_accumulation_steps: Micro-batches per step: each replica's
      slice of the global batch is cut into this many, and their gradients
      are summed before one update (same update, less memory).
    gradient_clip_norm: Clip the gradients (summed over replicas and
      micro-batches) to this global norm; None for no clipping.
    gradient_clip_value: Clip each gradient element to [-v, v]; None for no
      clipping.
    optimizer_parts: Per-part optimizers: part name -> a regular expression
      searched in the names of the model's trainable variables, each of
      which must match exactly one part; each part's optimizer is built
      under the gin scope of its name (`backbone/optimizer.name = "sgd"`,
      `backbone/optimizer.learning_rate = 1e-4`); None: one optimizer.
    learning_rate_multipliers: Part name -> a factor on that part's
      learning rate (its whole schedule), e.g. `{"backbone": 0.1}`.
    batch_scaling: None, `keep_global_batch` or `keep_per_replica_batch`:
      how batch sizes and the learning rate follow a replica count other
      than `reference_replicas` (see `trainer.model.scaling`).
    reference_replicas: The replica count the batch sizes are written for.
    on_nonfinite: What a non-finite training loss does: "stop" ends the run
      with an error naming the step; "rollback" restores the newest
      checkpoint and skips the batch of that step.
    max_rollbacks: With "rollback", stop anyway after this many.
    preemption_exit_code: Exit code after SIGTERM/SIGINT, once a checkpoint
      at the step reached is saved; tells a launcher to restart the job.
    preemption_grace_seconds: After SIGTERM/SIGINT, the process exits (with
      `preemption_exit_code`, keeping the checkpoints saved before) if
      training has not stopped by then; below the scheduler's own grace
      period before SIGKILL (Kubernetes and Slurm: 30 s by default).
    profile_steps: `(start, end)`: trace the steps from global step `start`
      to `end` with the TensorFlow profiler into `model_dir/train`; None for
      no trace.
    check_loss_scaling: On the first step of a new run on several
      replicas, with the Task's own `train_step`, compare its loss with the
      global-batch mean of `build_losses` on the same batch (with several
      models: the first replica's loss with what the same step reports for
      its batch on one device), and stop where it is the replica count
      times that (averaged per replica): one extra forward pass (several
      models: one step on one device), once (`trainer.model.loss_scaling`).
    callbacks: Keras callbacks (`tf_keras.callbacks.Callback`) run by the
      loop as `fit` runs them: a list (`[@CSVLogger(), @EarlyStopping()]`,
      the tf_keras classes are configurable by name) or a function
      returning one; an evaluation ends their epoch (in `train` mode, a
      train summary). Those that cannot work here are refused.
    optimizer: `optimizer.*`.
    learning_rate: `learning_rate.*`.
    ema: `ema.*`.
    warm_start: `warm_start.*`.
    export: `export.*`.
    best_checkpoint: `best_checkpoint.*`.
    early_stopping: `early_stopping.*`.
    pipeline: `pipeline.*`.
  """
  train_steps: int = 1000
  steps_per_loop: int = 100
  global_batch_size: int = 64
  eval_batch_size: int = 256
  validation_steps: eval_sets_lib.Steps = -1
  validation_interval: int = 0
  checkpoint_interval: int = 1000
  summary_interval: int = 100
  max_to_keep: int = 5
  keep_until_evaluated: bool = False
  continuous_eval_timeout: float = 3600.0
  eval_sets: Optional[Tuple[str, ...]] = None
  held_out_sets: Tuple[str, ...] = ()
  input_position: str = "checkpoint"
  mixture: Optional[Dict[str, float]] = None
  mixture_schedule: Optional[Dict[int, Dict[str, float]]] = None
  mixture_exhausted: str = "repeat"
  gradient_accumulation_steps: int = 1
  gradient_clip_norm: Optional[float] = None
  gradient_clip_value: Optional[float] = None
  optimizer_parts: Optional[Dict[str, str]] = None
  learning_rate_multipliers: Optional[Dict[str, float]] = None
  batch_scaling: Optional[str] = None
  reference_replicas: int = 1
  on_nonfinite: str = "stop"
  max_rollbacks: int = 3
  preemption_exit_code: int = 42
  preemption_grace_seconds: float = 25.0
  profile_steps: Optional[Tuple[int, int]] = None
  check_loss_scaling: bool = True
  callbacks: Any = None
  optimizer: optimization.OptimizerConfig = _bound(
      optimization.OptimizerConfig)
  learning_rate: optimization.ScheduleConfig = _bound(
      optimization.ScheduleConfig)
  ema: ema_lib.EmaConfig = _bound(ema_lib.EmaConfig)
  warm_start: warm_start_lib.WarmStartConfig = _bound(
      warm_start_lib.WarmStartConfig)
  export: exports.ExportConfig = _bound(exports.ExportConfig)
  best_checkpoint: actions.BestCheckpointConfig = _bound(
      actions.BestCheckpointConfig)
  early_stopping: actions.EarlyStoppingConfig = _bound(
      actions.EarlyStoppingConfig)
  pipeline: pipeline_lib.PipelineConfig = _bound(pipeline_lib.PipelineConfig)

  def __post_init__(self):
    optimizer_parts_lib.check(self.optimizer_parts,
                              self.learning_rate_multipliers)
    checks.field_types("trainer", self)
    object.__setattr__(self, "callbacks",
                       keras_callbacks.check(self.callbacks))
    self._check_loop()
    self._check_eval_sets()
    self._check_recovery()
    checks.require(
        not self.export.best or self.best_checkpoint.metric is not None,
        "`export.best` needs `best_checkpoint.metric`: it exports each new "
        "best checkpoint.")

  def _check_loop(self) -> None:
    """Checks the step counts, batch sizes and intervals of the loop."""
    for name in ("train_steps", "steps_per_loop", "global_batch_size",
                 "eval_batch_size", "checkpoint_interval", "summary_interval",
                 "max_to_keep", "gradient_accumulation_steps"):
      checks.positive(f"trainer.{name}", getattr(self, name))
    eval_sets_lib.check_steps(self.validation_steps)
    checks.at_least("trainer.validation_interval", self.validation_interval,
                    0)
    for name in ("summary_interval", "checkpoint_interval",
                 "validation_interval"):
      # Summaries, saves and evaluations happen between loops only.
      checks.require(
          getattr(self, name) % self.steps_per_loop == 0,
          f"`trainer.{name}` ({getattr(self, name)}) must be a multiple of "
          f"`trainer.steps_per_loop` ({self.steps_per_loop}).")
    # A callback's epoch ends at an evaluation, with the train summary's
    # scalars: one written at that step, not an older one.
    checks.require(
        not (self.callbacks and self.validation_interval and
             self.validation_interval % self.summary_interval),
        f"`trainer.callbacks` end an epoch at each evaluation (every "
        f"{self.validation_interval} steps) with the train summary's values, "
        f"written every {self.summary_interval} steps: make "
        "`trainer.summary_interval` divide `trainer.validation_interval`.")
    for name in ("gradient_clip_norm", "gradient_clip_value"):
      checks.number(f"trainer.{name}", getattr(self, name), above_zero=True,
                    optional=True)
    checks.choice("trainer.input_position", self.input_position,
                  INPUT_POSITIONS)
    if self.mixture is not None:
      object.__setattr__(self, "mixture",
                         mixture_lib.check_rates(self.mixture))
    checks.choice("trainer.mixture_exhausted", self.mixture_exhausted,
                  mixture_lib.EXHAUSTION)
    if self.mixture_schedule is not None:
      checks.require(
          self.mixture is None,
          "give `trainer.mixture` or `trainer.mixture_schedule`, not both.")
      object.__setattr__(self, "mixture_schedule",
                         mixture_lib.check_schedule(self.mixture_schedule))
    checks.choice("trainer.batch_scaling", self.batch_scaling, scaling.RULES,
                  optional=True)
    checks.positive("trainer.reference_replicas", self.reference_replicas)
    checks.positive("trainer.continuous_eval_timeout",
                    self.continuous_eval_timeout)
    profiler.check_steps(self.profile_steps)
    if self.profile_steps is not None:
      object.__setattr__(self, "profile_steps", tuple(self.profile_steps))

  def _check_eval_sets(self) -> None:
    """Checks the settings naming evaluation sets (the Task's sets are
    checked against them once it returns them), and that no judged metric
    is a held-out set's."""
    for name in ("eval_sets", "held_out_sets"):
      given = getattr(self, name)
      if given is None and name == "eval_sets":
        continue
      checks.require(
          isinstance(given, (tuple, list)) and
          (len(given) > 0 or name == "held_out_sets"),
          f"`trainer.{name}` ({given!r}) must be a tuple of set names, e.g. "
          "(\"clean\",).")
      for set_name in given:
        eval_sets_lib.check_name(set_name)
      object.__setattr__(self, name, tuple(given))
    if isinstance(self.validation_steps, dict):
      for set_name in self.validation_steps:
        eval_sets_lib.check_name(set_name)
    judged = {"best_checkpoint.metric": self.best_checkpoint.metric,
              "early_stopping.metric": self.early_stopping.metric}
    for setting, metric in judged.items():
      eval_sets_lib.check_judged(setting, metric, self.held_out_sets)

  @property
  def eval_steps(self) -> int:
    """The batches each evaluation asks of every set (the controller's
    `evaluate(steps)`): `validation_steps`, or -1 where it counts them by
    set (the evaluator then takes each set's own)."""
    if isinstance(self.validation_steps, int):
      return self.validation_steps
    return -1

  def _check_recovery(self) -> None:
    """Checks what non-finite losses and preemptions do."""
    checks.choice("trainer.on_nonfinite", self.on_nonfinite,
                  rollback.POLICIES)
    checks.at_least("trainer.max_rollbacks", self.max_rollbacks, 0)
    checks.require(
        1 <= self.preemption_exit_code <= 255,
        f"`trainer.preemption_exit_code` ({self.preemption_exit_code}) must "
        "be in [1, 255]: 0 tells a scheduler the job finished.")
    checks.require(
        checks.is_number(self.preemption_grace_seconds) and
        0 < self.preemption_grace_seconds < float("inf"),
        "`trainer.preemption_grace_seconds` "
        f"({self.preemption_grace_seconds!r}) must be a positive number of "
        "seconds, below the scheduler's grace period before SIGKILL.")
