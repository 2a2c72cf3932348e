"""Command line: flags in, a validated experiment run out.

    python train.py --gin_file=gin/digits.gin --model_dir=runs/digits \
        --gin_param='trainer.train_steps=2000' [--mode=train_and_eval]

Configuration errors (gin syntax, unknown or misspelled names, bad values,
bad flags) end the process with exit code 2 and one line on stderr, before
`model_dir` is created or changed.
"""

import contextlib
import dataclasses
import gc
import os
import sys
import threading
from typing import Callable, List, Optional, Sequence, Union

from absl import app
from absl import flags
import gin
import tensorflow as tf

from trainer import config as config_lib
from trainer import console
from trainer import errors
from trainer import experiment
from trainer import gin_config
from trainer import preemption
from trainer import runtime as runtime_lib
from trainer import user_errors
from trainer.distribute import slurm
from trainer.model import task as task_lib
from trainer.report import run_report
from trainer.report import tf_logs
from trainer.report import usage
from trainer.storage import checkpoints
from trainer.storage import files

USAGE_EXIT_CODE = 2
RUNTIME_ERROR_EXIT_CODE = 1
TRAINING_MODES = ("train", "train_and_eval")
# Held by the thread that prints the error line and exits: the main thread
# and the signal receiver may both fail at once, and one line is printed.
_FAILING = threading.Lock()

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin config file; repeatable, "
                          "later files override earlier ones.")
flags.DEFINE_multi_string("gin_param", [], "Gin binding such as "
                          "'trainer.train_steps=100'; repeatable, applied "
                          "after the files.")
flags.DEFINE_string("model_dir", None, "Directory for checkpoints, summaries "
                    "and the operative config.")
flags.DEFINE_enum("mode", "train_and_eval", experiment.MODES, "What to run.")
flags.DEFINE_bool("dry_run", False, "Validate the configuration, build the "
                  "model and datasets, run one train and one eval step in a "
                  "temporary directory, print the resolved config and exit; "
                  "--model_dir is not touched.")
flags.DEFINE_bool("full_traceback", False, "On an error, print the full "
                  "traceback (TensorFlow's and Keras's frames included) "
                  "before the one-line summary; also set by the environment "
                  f"variable {user_errors.FULL_TRACEBACK_ENV}=1.")


# The flags of train.py, and those of a script taking a task's configuration.
TRAIN_FLAGS = ("gin_file", "gin_param", "model_dir", "mode", "dry_run",
               "full_traceback")
TOOL_FLAGS = ("gin_file", "gin_param", "full_traceback")


def _check_model_dir(model_dir: Optional[str]) -> str:
  if not model_dir:
    raise errors.ConfigError("--model_dir is required.")
  files.check_path(model_dir, "--model_dir")
  if files.is_url(model_dir):
    _check_url_model_dir(model_dir)
    return model_dir
  _check_local_model_dir(model_dir)
  return model_dir


def _check_local_model_dir(model_dir: str) -> None:
  """The operating system's checks of a local model_dir (not a URL)."""
  link = model_dir.rstrip("/")
  is_dir = os.path.isdir(model_dir)  # local-path: not a URL
  if os.path.exists(model_dir) and not is_dir:  # local-path: not a URL
    raise errors.ConfigError(
        f"--model_dir ({model_dir}) is a file, not a directory.")
  if os.path.islink(link) and not is_dir:  # local-path: not a URL
    raise errors.ConfigError(
        f"--model_dir ({model_dir}) is a symlink to {os.readlink(link)}, "
        "which does not exist.")
  existing = files.absolute(model_dir)
  while not os.path.exists(existing):  # local-path: not a URL
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):  # local-path: not a URL
    raise errors.ConfigError(
        f"--model_dir ({model_dir}) cannot be created: {existing} is a file.")
  if not os.access(existing, os.W_OK | os.X_OK):  # local-path: not a URL
    raise errors.ConfigError(f"--model_dir ({model_dir}) is not writable: "
                             f"no write permission on {existing}.")


def _check_url_model_dir(model_dir: str) -> None:
  """The checks of a URL model_dir that can be made before the run: its
  bucket exists, and the path is not an object. Whether this process may
  write there shows at the first write, which nothing precedes."""
  if files.scheme(model_dir) == "gs":
    bucket = "gs://" + model_dir[len("gs://"):].split("/", 1)[0]
    if not files.isdir(bucket):
      raise errors.ConfigError(
          f"--model_dir ({model_dir}): bucket {bucket} does not exist or "
          "this process may not read it.")
  if files.isfile(model_dir.rstrip("/")):
    raise errors.ConfigError(
        f"--model_dir ({model_dir}) is an object (a file), not a directory.")


def _quiet_teardown() -> None:
  """Frees what the failed run left, without TensorFlow's warnings.

  An interrupted restore warns, when collected, about every checkpoint
  value it did not use; that would bury the one error line under dozens.
  """
  tf.get_logger().setLevel("ERROR")
  gc.collect()


def fail(message: Union[str, Callable[[], str]],
         exit_code: int = USAGE_EXIT_CODE, program: str = "train.py",
         asked: bool = False) -> None:
  """Prints the error line last on stderr and exits with `exit_code`.

  Callable from any thread; a second caller waits for the first's exit.
  `message` may be a function returning the line: it is called once this
  caller is the one to exit (a SLURM requeue, which signals this process,
  happens there). A stop the user `asked` for (Ctrl-C) is not an error:
  its line has no `error:`.
  """
  _FAILING.acquire()  # pylint: disable=consider-using-with
  if callable(message):
    message = message()
  console.error(f"{program}: {'' if asked else 'error: '}{message}")
  # TensorFlow's C++ threads may still log while the process winds down (a
  # peer's collective failing, say); the error line stays the last one.
  devnull = os.open(os.devnull, os.O_WRONLY)  # local-path: /dev/null
  os.dup2(devnull, sys.stderr.fileno())
  sys.stdout.flush()
  # After an error in a prefetched input, interpreter exit may wait forever
  # in ~IteratorResource for the prefetch thread (1 run in 5 here); what must
  # be written (checkpoints, summaries) already is.
  os._exit(exit_code)  # pylint: disable=protected-access


# Model Garden's `train.py` flags, which a user of it types first.
_MODEL_GARDEN_FLAGS = ("experiment", "config_file", "params_override")


def _model_garden_hint(message: str) -> str:
  """For an unknown flag of Model Garden's `train.py`, where it goes here."""
  for name in _MODEL_GARDEN_FLAGS:
    if f"Unknown command line flag '{name}'" in message:
      return (f": Model Garden's --{name} is the gin binding "
              f"`model_garden_task.{name}` here (--gin_param="
              f"'model_garden_task.{name}=...'; "
              "docs/coming-from-model-garden.md)")
  return ""


def parse_flags(argv: List[str], program: str = "train.py",
                shared: Sequence[str] = TRAIN_FLAGS) -> List[str]:
  """Parses flags; a bad flag is one line on stderr and exit code 2.

  `--help` (and `-h`, `--helpfull`) prints the running program's docstring
  and its flags (its own and `shared`), then exits 0.
  """
  usage.exit_if_requested(argv, getattr(sys.modules["__main__"], "__doc__",
                                        None), shared)
  try:
    return FLAGS(argv)
  except flags.Error as e:
    fail(str(e).splitlines()[0] + _model_garden_hint(str(e)),
         program=program)


@contextlib.contextmanager
def _one_line_failures():
  """Turns the errors a run reports into one stderr line and an exit code.

  The framework's own errors keep their message. Any other error, most
  often raised by the task's code while it is traced or run, is condensed
  to its cause and the user's file, line and hook (`user_errors.describe`),
  after the full traceback if `--full_traceback` asks for it.
  """
  full = (FLAGS["full_traceback"].value or
          user_errors.full_traceback_requested())
  if full:
    # TensorFlow and Keras otherwise cut their own frames out.
    tf.debugging.disable_traceback_filtering()
  failure = None
  try:
    yield
  except errors.ConfigError as e:
    failure = (str(e), USAGE_EXIT_CODE)
  except (errors.NonFiniteError, errors.RunError) as e:
    failure = (str(e), RUNTIME_ERROR_EXIT_CODE)
  except errors.Preempted as e:
    failure = (preemption.exit_line(e, slurm.requeue_outcome),
               e.exit_code, "train.py", e.asked)
  except Exception as e:  # pylint: disable=broad-except
    # A failed peer (UnavailableError), a lost device, a full disk or a
    # mistake in the task: checkpoints already written stay, and a restart
    # resumes from the newest.
    if full:
      console.error(user_errors.full_traceback(e).rstrip("\n"))
    failure = (user_errors.describe(e), RUNTIME_ERROR_EXIT_CODE)
  if failure:
    _quiet_teardown()
    fail(*failure)


def main(model_dir: str, task: task_lib.Task,
         runtime: runtime_lib.RuntimeConfig,
         config: config_lib.TrainerConfig,
         receiver: Optional[preemption.Receiver] = None) -> int:
  """Runs the validated experiment in `FLAGS.mode`; returns the exit code.

  `receiver` is the process's signal receiver, which the run's preemption
  watcher attaches to.
  """
  console.configure(verbosity_asked=FLAGS["verbosity"].present)
  console.log(f"task {type(task).__name__}, mode {FLAGS.mode}, model_dir "
              f"{model_dir}")
  if FLAGS.dry_run:
    return dry_run(task, runtime, config, model_dir, receiver)
  with _one_line_failures():
    results = experiment.run(task, FLAGS.mode, model_dir, runtime, config,
                             receiver=receiver)
  if results and FLAGS.mode not in TRAINING_MODES:
    # A training run's closing block holds its final evaluation.
    console.info("final eval | " + run_report.format_results(
        results, config.held_out_sets))
  return 0


def dry_run(task: task_lib.Task, runtime: runtime_lib.RuntimeConfig,
            config: config_lib.TrainerConfig, model_dir: str,
            receiver: Optional[preemption.Receiver] = None) -> int:
  """Runs one train and one eval step in a temporary directory.

  Everything a real run builds is built (strategy, model, optimizer, both
  datasets, the compiled steps), so a problem shows in seconds rather than
  at the first evaluation hours later. If `model_dir` holds a checkpoint,
  the step starts from it (read, never written), so a checkpoint that does
  not fit the configured model is reported too. Returns the exit code.
  """
  restore_dir = model_dir if files.isdir(model_dir) else None
  start = checkpoints.newest_step(restore_dir) if restore_dir else 0
  # The Keras callbacks are checked with the configuration but not run:
  # theirs are files outside `model_dir` (a CSVLogger's) that a dry run
  # must not touch.
  trial = dataclasses.replace(
      config, train_steps=start + 1, steps_per_loop=1, summary_interval=1,
      checkpoint_interval=1, validation_interval=0, validation_steps=1,
      callbacks=())
  # Its own scratch, removed after: a dry run never writes `model_dir`.
  directory = files.scratch_directory("dry_run-")
  try:
    with _one_line_failures():
      results = experiment.run(task, "train_and_eval", directory, runtime,
                               trial, restore_dir=restore_dir,
                               receiver=receiver, dry_run=True)
  finally:
    files.rmtree(directory)
  console.info("dry run | resolved configuration:\n" +
               gin.operative_config_str().rstrip())
  origin = (f"from the checkpoint at step {start} in {model_dir}" if start
            else "from scratch")
  console.info(f"dry run | ok: one train step ({origin}) and one eval step "
               "ran | " + run_report.format_results(results,
                                                    config.held_out_sets))
  return 0


def _fail_config(error: errors.ConfigError, program: str = "train.py"
                 ) -> None:
  """Fails with a configuration error's line; for an error of the user's
  own code (their module as gin imports it, their Task's constructor), with
  its full traceback first where `--full_traceback` asks for it."""
  if (error.__cause__ is not None and
      (FLAGS["full_traceback"].value or
       user_errors.full_traceback_requested()) and
      user_errors.in_user_code(error.__cause__)):
    console.error(user_errors.full_traceback(error.__cause__).rstrip("\n"))
  fail(str(error), program=program)


def run_tool(main: Callable[..., None], program: str, example: str) -> None:
  """Entry point of a script that takes a task's configuration as `train.py`
  does (gin files, positional or `--gin_file`, and `--gin_param`).

  Flags and configuration are checked before TensorFlow starts; a problem is
  one line on stderr and exit code 2.

  Args:
    main: Called as `main(gin_files, task, runtime, config)`.
    program: The script's name, for error lines.
    example: A gin file to suggest when none is given.
  """
  argv = parse_flags(sys.argv, program, TOOL_FLAGS)
  gin_files = argv[1:] + FLAGS.gin_file
  if not gin_files:
    fail(f"give a task's gin file, e.g. {example}", program=program)
  try:
    loaded = gin_config.load_config(gin_files, FLAGS.gin_param)
  except errors.ConfigError as e:
    _fail_config(e, program)
  _quiet_tensorflow()
  app.run(lambda _: main(gin_files, *loaded), argv=argv[:1])


def _check_kill_wait(grace_seconds: float) -> None:
  """Warns, in a SLURM job, if the grace period for a checkpoint after
  SIGTERM does not end before SLURM's SIGKILL."""
  kill_wait = slurm.kill_wait_seconds()
  if kill_wait is not None and grace_seconds >= kill_wait:
    console.warning(
        f"`trainer.preemption_grace_seconds` ({grace_seconds:g} s) is not "
        f"below SLURM's KillWait ({kill_wait} s): its SIGKILL may cut the "
        "checkpoint a SIGTERM asks for; set it a few seconds lower.")


def run() -> None:
  """Entry point used by `train.py`.

  Flags are parsed and the configuration validated before `absl.app.run`,
  whose start-up initialises TensorFlow's devices (and, on machines without
  a GPU, prints a CUDA error line) before a bad configuration could be
  reported. SIGTERM and SIGINT are received from here on by a thread of
  their own (`trainer.preemption`); `train.py` blocks them earlier still.
  """
  signals = preemption.start_receiver(fail, slurm.requeue_outcome)
  argv = parse_flags(sys.argv)
  if len(argv) > 1:
    fail(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    model_dir = _check_model_dir(FLAGS.model_dir)
    loaded = gin_config.load_config(FLAGS.gin_file, FLAGS.gin_param)
  except errors.ConfigError as e:
    _fail_config(e)
  config = loaded[2]
  signals.configure(config.preemption_exit_code,
                    config.preemption_grace_seconds,
                    training=FLAGS.mode in TRAINING_MODES or FLAGS.dry_run)
  _check_kill_wait(config.preemption_grace_seconds)
  _quiet_tensorflow()
  app.run(lambda _: _collected(main(model_dir, *loaded, receiver=signals)),
          argv=sys.argv[:1])


def _collected(exit_code: int) -> int:
  """Frees what the run left, then spares the interpreter's exit most of
  its garbage collection; returns `exit_code`.

  The run's objects are collected here, as the exit would (a summary
  writer in a reference cycle flushes when it is freed). What is left is
  mostly TensorFlow's modules, which the exit's collections would walk
  through again for nothing: frozen, they are skipped (measured: a 1-step
  digits run's exit took 1.0-1.9 s, 0.3-0.4 s with this). The exit still
  runs `atexit` functions, flushes streams and frees objects by reference
  count.
  """
  gc.collect()
  gc.freeze()
  return exit_code


def _quiet_tensorflow() -> None:
  """Keeps what TensorFlow prints at start-up to what concerns the run."""
  tf_logs.keep_python_warnings_single()
  tf_logs.route_keras_notices()
  tf_logs.apply_min_log_level_to_absl()
  tf_logs.probe_devices()
