"""`scripts/sweep.py`'s flags and main: check everything, then sweep.

`--gin_file`, `--gin_param` and `--mode` are train.py's own flags, passed
to every trial. Bad input ends the sweep before any trial starts, with one
line and exit code 2, and nothing written.
"""

import errno
import os
import shlex
import shutil
import signal
import sys
import time
from typing import List, Optional, Tuple

from absl import flags
import optuna

from trainer import cli
from trainer import console
from trainer import errors
from trainer.data import eval_sets
from trainer.storage import files
from trainer.sweeps import checks
from trainer.sweeps import hparams
from trainer.sweeps import journal
from trainer.sweeps import locks
from trainer.sweeps import report
from trainer.sweeps import space as space_lib
from trainer.sweeps import study as study_lib
from trainer.sweeps import warm
from trainer.sweeps import worker

PROGRAM = "sweep.py"
TRAIN_FLAGS = ("gin_file", "gin_param", "mode", "full_traceback")
SWEEP_FLAGS = ("sweep_dir", "space", "metric", "direction", "n_trials",
               "sampler", "seed", "pruner", "pruner_startup_trials",
               "parallel", "storage", "stop_after_failures", "report",
               "poll_seconds", "partial_grid", "launcher")
STOPPED_EXIT_CODE = 42
# What a full or read-only disk raises (root gets EROFS, others EACCES).
_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                errno.EPERM)

# The sweep's flags are defined here, not in scripts/sweep.py, so `--help`
# lists them as shared flags (it lists the script's own and those named).
FLAGS = flags.FLAGS
flags.DEFINE_string("sweep_dir", None, "Directory of the sweep: the study "
                    "(journal file), one model_dir per trial (trial-<n>), "
                    "results.csv. A URL (gs://...) too: one process sweeps "
                    "it, its journal kept locally and copied there.")
flags.DEFINE_multi_string("space", [], "A swept binding: 'BINDING=[a, b]', "
                          "'BINDING=loguniform(a, b)', 'BINDING=uniform(a, "
                          "b)' or 'BINDING=int(a, b)'; repeatable.")
flags.DEFINE_string("metric", None, "The evaluation result to optimise, "
                    "e.g. accuracy.")
flags.DEFINE_enum("direction", "maximize", study_lib.DIRECTIONS,
                  "Whether a higher or a lower metric is better.")
flags.DEFINE_integer("n_trials", 10, "Trials in the study at the end, those "
                     "of earlier runs of the sweep included.", lower_bound=1)
flags.DEFINE_enum("sampler", "auto", ("auto",) + study_lib.SAMPLERS,
                  "Optuna's sampler; auto: grid when every --space is a "
                  "list, else tpe.")
flags.DEFINE_bool("partial_grid", False, "With a grid larger than "
                  "--n_trials, run --n_trials of its points (the grid "
                  "sampler picks them, seeded by --seed) instead of "
                  "refusing it.")
flags.DEFINE_integer("seed", 0, "Seed of the sampler.")
flags.DEFINE_enum("pruner", "none", study_lib.PRUNERS, "Optuna's pruner, fed "
                  "each evaluation of the metric.")
flags.DEFINE_integer("pruner_startup_trials", 3, "Trials the median pruner "
                     "lets finish before it prunes.", lower_bound=0)
flags.DEFINE_integer("parallel", 1, "Trials run at once by this process.",
                     lower_bound=1)
flags.DEFINE_string("storage", None, "An RDB URL for the study (e.g. "
                    "sqlite:///sweep.db); default: a journal file in "
                    "--sweep_dir.")
flags.DEFINE_integer("stop_after_failures", 3, "Stop (exit 1) when this many "
                     "trials failed and none completed.", lower_bound=1)
flags.DEFINE_bool("report", False, "Print the table of the sweep in "
                  "--sweep_dir, write its results.csv, and exit.")
flags.DEFINE_string("launcher", None, "A command to run each trial's "
                    "train.py (and the dry run) under, e.g. 'srun "
                    "--ntasks=2 --overlap' for multi-worker trials in a "
                    "SLURM job (docs/sweeps.md).")
flags.DEFINE_float("poll_seconds", 1.0, "Wait between looks at a running "
                   "trial's evaluations.", lower_bound=0.05)


def _plan(sweep_dir: str, space, config, total: int) -> worker.Plan:
  return worker.Plan(
      sweep_dir=sweep_dir, space=tuple(space), metric=FLAGS.metric,
      gin_files=tuple(FLAGS.gin_file), gin_params=tuple(FLAGS.gin_param),
      mode=FLAGS.mode, total=total,
      stop_after_failures=FLAGS.stop_after_failures,
      preemption_exit_code=config.preemption_exit_code,
      poll_seconds=FLAGS.poll_seconds, launcher=launcher())


def launcher() -> Tuple[str, ...]:
  """`--launcher`, split as a shell would.

  Raises:
    errors.ConfigError: If it cannot be split, or names no program on PATH.
  """
  if not FLAGS.launcher:
    return ()
  try:
    words = tuple(shlex.split(FLAGS.launcher))
  except ValueError as e:
    raise errors.ConfigError(
        f"--launcher={FLAGS.launcher!r} cannot be split: {e}.") from e
  if not words or shutil.which(words[0]) is None:  # local-path: on PATH
    raise errors.ConfigError(
        f"--launcher={FLAGS.launcher!r}: "
        f"{words[0] if words else 'nothing'} is not a program on PATH.")
  return words


def _report_lines(study: optuna.Study, sweep_dir: str,
                  unwritten: str = "") -> List[str]:
  """The report; results.csv and .png are written only from a whole read
  of the study, and unless `unwritten` says why not."""
  recorded = study.user_attrs.get("sweep", {})
  space = space_lib.parse_space(recorded.get("space", []))
  trials, damage = study_lib.whole_trials(study)
  if damage:
    unwritten = (f"its study's journal is damaged at {damage}, so the "
                 "table may miss what came after; rerun the sweep to cut "
                 "it back")
  return report.lines(trials, space, recorded["metric"],
                      recorded["direction"], recorded["gin_files"],
                      recorded["gin_params"], recorded["mode"], sweep_dir,
                      launcher(), unwritten)


def _writable(directory: str) -> bool:
  """Whether `directory` can be written; a URL's, as far as one can tell
  without writing, can."""
  if files.is_url(directory):
    return True
  # `os.access` answers for root too on a read-only filesystem (EROFS).
  return os.access(directory, os.W_OK)  # local-path: not a URL (above)


def report_only(sweep_dir: str) -> int:
  """`--report`: the table of an existing sweep; its results.csv and
  results.png where the sweep directory can be written. Repairs nothing."""
  if not study_lib.exists(sweep_dir, FLAGS.storage):
    raise errors.ConfigError(f"no sweep in {sweep_dir} to report.")
  study = study_lib.load(sweep_dir, FLAGS.storage, repair=False)
  report.print_lines(_report_lines(
      study, sweep_dir,
      "" if _writable(sweep_dir) else f"{sweep_dir} is read-only"))
  return 0


def sampler_kind(space) -> str:
  """`--sampler`; `auto` is a grid where every dimension is a list (TPE
  would sample some points twice and miss others), else TPE."""
  if FLAGS.sampler != "auto":
    return FLAGS.sampler
  return ("grid" if all(d.kind == "choice" for d in space) else "tpe")


def prepare(sweep_dir: str, ahead: Optional[warm.Ahead] = None):
  """Checks every input; returns the plan, the study's identity, and
  whether the study exists already. Writes nothing but, for a URL sweep,
  its journal's local copy (`journal.restore`). With `ahead`, its process
  runs the dry run of a new sweep, and the first trial's process starts
  once the bindings are checked.

  Raises:
    errors.ConfigError: The first problem, as one line.
  """
  if not FLAGS.metric:
    raise errors.ConfigError("--metric is required, e.g. --metric=accuracy.")
  checks.check_mode(FLAGS.mode)
  space = space_lib.parse_space(FLAGS.space)
  total = FLAGS.n_trials
  if sampler_kind(space) == "grid":
    space_lib.grid(space)
    total = checks.grid_trials(space_lib.grid_size(space), FLAGS.n_trials,
                               FLAGS.partial_grid)
  wanted = study_lib.identity(space, FLAGS.metric, FLAGS.direction,
                              FLAGS.gin_file, FLAGS.gin_param, FLAGS.mode)
  exists = study_lib.exists(sweep_dir, FLAGS.storage)
  python = ahead.dry_run if ahead else None
  dry_run = None if exists else checks.DryRun(
      FLAGS.gin_file, FLAGS.gin_param, space_lib.first_point(space),
      launcher(), python)
  if python is not None:
    python.close()  # Unless the dry run took it.
  try:
    config = checks.load_trial_configs(FLAGS.gin_file, FLAGS.gin_param,
                                       space)
    # A held-out set's result (a test set) never chooses a trial.
    eval_sets.check_judged("--metric", FLAGS.metric, config.held_out_sets)
    left = total
    if exists:
      study = study_lib.load(sweep_dir, FLAGS.storage, repair=False)
      study_lib.check_identity(study, wanted, sweep_dir)
      left = study_lib.trials_left(study, total)
    if ahead is not None and left:  # A sweep all done starts no trial.
      ahead.first_trial()
    if not exists:
      checks.check_metric(FLAGS.metric, dry_run.metrics())
  finally:
    if dry_run:
      dry_run.cancel()
  return _plan(sweep_dir, space, config, total), wanted, exists


def sweep(sweep_dir: str, ahead: Optional[warm.Ahead] = None) -> int:
  """Runs the sweep, in the processes `ahead` if given; returns the exit
  code. A URL sweep directory is this process's alone (`locks.alone`)."""
  with locks.alone(sweep_dir):
    return _sweep(sweep_dir, ahead)


def _sweep(sweep_dir: str, ahead: Optional[warm.Ahead]) -> int:
  started = time.monotonic()
  plan, wanted, exists = prepare(sweep_dir, ahead)
  files.makedirs(sweep_dir)
  with locks.held(locks.claims(sweep_dir)):
    study = study_lib.open_study(
        sweep_dir, FLAGS.storage, wanted,
        study_lib.sampler(sampler_kind(plan.space), FLAGS.seed, plan.space),
        study_lib.pruner(FLAGS.pruner, FLAGS.pruner_startup_trials))
    if not exists:
      hparams.write_experiment(sweep_dir, plan.space, plan.metric)
  copy = None if FLAGS.storage else journal.url_copy(sweep_dir)
  if copy:
    journal.save(sweep_dir)  # The study, before its first trial ends.
    console.info(f"sweep | {sweep_dir}: journal kept at "
                 f"{journal.path(sweep_dir)} (Optuna's journal needs a local "
                 f"file system); copied to {copy} as each trial starts and "
                 "ends")
  done = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
  console.info(f"sweep | {sweep_dir}: {done} of {plan.total} trials done | "
               f"{sampler_kind(plan.space)} sampler, {FLAGS.pruner} pruner, "
               f"{FLAGS.parallel} at once | {plan.metric}, {FLAGS.direction} "
               f"| checked in {time.monotonic() - started:.1f} s")
  runner = worker.Sweep(study, plan, ahead and ahead.trials)
  # SIGUSR1: SLURM's time-limit warning, which the trial gets too (it saves
  # and requeues the job); without a handler it would kill the sweep.
  for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(signum, lambda signum, _: runner.interrupt(signum))
  runner.run(FLAGS.parallel)
  journal.save(sweep_dir)
  if runner.error:  # The disk is full or read-only: writing more fails too.
    cli.fail(runner.error, exit_code=1, program=PROGRAM)
  report.print_lines(_report_lines(study, sweep_dir))
  if runner.first_failure:
    cli.fail(runner.first_failure, exit_code=1, program=PROGRAM)
  if runner.stop.is_set():
    console.info("sweep | stopped: rerun the same command to resume")
    return STOPPED_EXIT_CODE
  if runner.killed:
    cli.fail(runner.killed_line(), exit_code=1, program=PROGRAM)
  return 0


def main(ahead: Optional[warm.Ahead] = None) -> None:
  """Entry point of `scripts/sweep.py`, which may have started processes
  `ahead` for the dry run and the first trial (`trainer.sweeps.warm`)."""
  argv = cli.parse_flags(sys.argv, PROGRAM, SWEEP_FLAGS + TRAIN_FLAGS)
  if len(argv) > 1:
    cli.fail(f"unexpected arguments: {' '.join(argv[1:])}", program=PROGRAM)
  console.configure(verbosity_asked=FLAGS["verbosity"].present)
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  try:
    if not FLAGS.sweep_dir:
      raise errors.ConfigError("--sweep_dir is required.")
    files.check_path(FLAGS.sweep_dir, "--sweep_dir")
    if ahead is not None and (FLAGS.report or FLAGS.launcher):
      ahead.close()  # None is run: the launcher starts every process.
      ahead = None
    if FLAGS.report:
      sys.exit(report_only(FLAGS.sweep_dir))
    sys.exit(sweep(FLAGS.sweep_dir, ahead))
  except errors.ConfigError as e:
    cli.fail(str(e), program=PROGRAM)
  except OSError as e:
    if e.errno not in _DISK_ERRORS:
      raise
    cli.fail(worker.disk_error(e), exit_code=1, program=PROGRAM)
