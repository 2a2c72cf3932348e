"""tf.data service: the training input produced by other processes.

When one host's CPUs cannot feed training, TensorFlow's tf.data service
runs the input pipeline on data workers elsewhere: a dispatcher
(`tf.data.experimental.service.DispatchServer`) hands the pipeline, as a
serialised dataset graph, to its workers (`WorkerServer`s), and the trainer
reads finished batches from them over gRPC. `scripts/data_service.py`
starts a dispatcher or a worker process; `runtime.data_service` names the
dispatcher, and `distribute` routes the training input through it.

What the workers run is everything `DistributedInput` builds before
prefetching: the Task's `build_inputs`, the framework's batching and the
Task's `preprocess_batch`. The pipeline must be pure TensorFlow (no
`py_function` or generator: a worker cannot run the trainer's Python), and
its ops must be registered in the worker (`scripts/data_service.py`
imports tensorflow-text for that).

Resuming: the service's iterator cannot be saved in a checkpoint
(`SaveInternal is not yet supported`, measured), and its batches come in
the order workers finish them. A resumed run reads the pipeline from its
start again (`trainer.input_position='skip'` instead reads and drops as many
batches as were trained on, through the service: an approximation, since
the order is not reproducible). A dispatcher restarted without a journal
forgets every job: the trainer goes on with a new one
(`runners.TaskTrainer`), which also reads the pipeline from its start.

This module checks the settings, routes the input and words the job's
lines; `dispatcher` asks a dispatcher whether it is there and for its
workers; `stall_watch` warns about, and ends, a wait for batches.
"""

import re

import tensorflow as tf

from trainer import checks
from trainer import errors
from trainer import user_errors
from trainer.data import dispatcher

MODES = ("distributed_epoch", "parallel_epochs")
# The strategies whose trainer is one process reading one input pipeline.
STRATEGIES = ("default", "one_device", "mirrored", "central_storage")
_ADDRESS = re.compile(r"^(grpc://)?[^:/\s]+:\d{1,5}$")
_SHARDING = {
    # Each worker reads splits of the source (an epoch counter, a file
    # list) handed out by the dispatcher: every example once per epoch.
    "distributed_epoch": tf.data.experimental.service.ShardingPolicy.DYNAMIC,
    # Each worker runs the whole pipeline on its own.
    "parallel_epochs": tf.data.experimental.service.ShardingPolicy.OFF,
}


def check(runtime) -> None:
  """Checks the `runtime.data_service*` settings of a `RuntimeConfig`.

  Raises:
    errors.ConfigError: For a malformed address, an unknown mode, a job
      name without a service, a strategy with several trainer processes, or
      `runtime.deterministic`.
  """
  checks.choice("runtime.data_service_mode", runtime.data_service_mode,
                MODES)
  if runtime.data_service_timeout is not None:
    checks.positive("runtime.data_service_timeout",
                    runtime.data_service_timeout)
  if runtime.data_service is None:
    checks.require(
        runtime.data_service_job_name is None,
        "`runtime.data_service_job_name` needs `runtime.data_service`.")
    return
  checks.require(
      isinstance(runtime.data_service, str) and
      bool(_ADDRESS.match(runtime.data_service)),
      f"`runtime.data_service` ({runtime.data_service!r}) must be the "
      "dispatcher's address, `grpc://host:port` (or `host:port`).")
  checks.require(
      runtime.data_service_job_name is None or (
          isinstance(runtime.data_service_job_name, str) and
          runtime.data_service_job_name),
      f"`runtime.data_service_job_name` ({runtime.data_service_job_name!r}) "
      "must be a non-empty string or None.")
  checks.require(
      runtime.distribution_strategy in STRATEGIES,
      "`runtime.data_service` feeds a trainer that is one process ("
      f"{', '.join(STRATEGIES)}), not '{runtime.distribution_strategy}'.")
  checks.require(
      not runtime.deterministic,
      "`runtime.deterministic` cannot be used with `runtime.data_service`: "
      "its workers hand out batches in the order they finish them, so no "
      "rerun or resumed run sees the same batches.")


def address(runtime) -> str:
  """Returns the dispatcher's address with its protocol, `grpc://host:port`."""
  service = runtime.data_service
  return f"grpc://{dispatcher.host_port(service)}"


def distribute(dataset: tf.data.Dataset, runtime) -> tf.data.Dataset:
  """Returns `dataset` produced by the tf.data service `runtime` names.

  Args:
    dataset: The pipeline the data workers run.
    runtime: A `RuntimeConfig` with `data_service` set.
  """
  return dataset.apply(tf.data.experimental.service.distribute(
      processing_mode=_SHARDING[runtime.data_service_mode],
      service=address(runtime), job_name=runtime.data_service_job_name))


def describe(runtime) -> str:
  """Returns a line saying where the training batches come from."""
  job = runtime.data_service_job_name
  return (f"input | training batches from the tf.data service at "
          f"{address(runtime)} ({runtime.data_service_mode}"
          f"{f', shared job {job!r}' if job else ''})")


# New jobs tried in a row, each yielding no batch, before a run gives up.
NEW_JOBS = 3


def _not_found(error: tf.errors.NotFoundError) -> str:
  """The service's own words, without TensorFlow's graph and op tags."""
  return user_errors.cause(error).removeprefix("NotFoundError: ")


def new_job_line(step: int) -> str:
  """Says that training reads from a new job after the service lost its own.

  Seen after a dispatcher without a journal was restarted, in two
  wordings: "Unknown iteration client id" (asking the dispatcher) or
  "Iteration id ... not found" (asking a worker).
  """
  return (f"the tf.data service lost this run's job at step {step} (a "
          "dispatcher restarted without `--work_dir` keeps none): training "
          "goes on with a new job, reading the input from its first batch")


def lost_job(error: tf.errors.NotFoundError, jobs: int) -> errors.RunError:
  """The error that ends a run when `jobs` new jobs in a row yielded
  nothing."""
  return errors.RunError(
      f"the tf.data service lost this run's job, and {jobs} new job(s) in a "
      "row yielded no batch: check the dispatcher and its workers (python "
      "scripts/data_service.py), then run the same command again to resume "
      f"from the newest checkpoint ({_not_found(error)})")


def check_reachable(runtime, timeout: float = 10.0) -> None:
  """Raises unless a dispatcher answers at `runtime.data_service`.

  TensorFlow's client retries an unreachable dispatcher forever, silently
  (measured: a run pointed at a closed port stayed at its first line).

  Raises:
    errors.ConfigError: Naming the address and what answers there.
  """
  port = address(runtime).rsplit(":", 1)[1]
  try:
    dispatcher.ask_dispatcher(address(runtime), timeout)
  except dispatcher.NoDispatcher as e:
    raise errors.ConfigError(
        f"no tf.data service dispatcher at {address(runtime)} "
        f"(`runtime.data_service`): {e.reason}; start one with "
        f"python scripts/data_service.py --port={port}") from None
