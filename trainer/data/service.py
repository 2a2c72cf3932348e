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
"""

import re
import threading
import time
from typing import Callable, List, Optional

import tensorflow as tf

from trainer import checks
from trainer import console
from trainer import errors
from trainer import user_errors

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
  return f"grpc://{host_port(service)}"


def host_port(target: str) -> str:
  """Returns `host:port` of `[grpc://]host:port`."""
  return target.removeprefix("grpc://")


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


class NoDispatcher(OSError):
  """No tf.data service dispatcher answers at an address.

  Attributes:
    reason: Why, in a few words ("Connection refused", ...).
    may_start: True when nothing listens there: a dispatcher not started
      yet; False when something else answers.
  """

  def __init__(self, reason: str, may_start: bool):
    super().__init__(reason)
    self.reason = reason
    self.may_start = may_start


_GET_VERSION = "/tensorflow.data.DispatcherService/GetVersion"


def _call(target: str, method: str, timeout: float) -> bytes:
  """Calls a dispatcher's `method` with an empty request at
  `[grpc://]host:port`; returns the serialised reply.

  Raises:
    NoDispatcher: Saying why, and whether nothing listens there.
  """
  import grpc  # pylint: disable=g-import-not-at-top  TensorFlow's own dependency; needed here only.
  with grpc.insecure_channel(host_port(target)) as channel:
    try:
      return channel.unary_unary(method)(b"", timeout=timeout)
    except grpc.RpcError as e:
      code = e.code()
      if code == grpc.StatusCode.UNAVAILABLE:  # "...: Connection refused"
        raise NoDispatcher(e.details().rsplit(": ", 1)[-1], True) from None
      if code == grpc.StatusCode.UNIMPLEMENTED:
        raise NoDispatcher("a gRPC server answers that is not a tf.data "
                           "service dispatcher (a worker's port?)",
                           False) from None
      if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        raise NoDispatcher(f"something listens there but gives no gRPC "
                           f"answer in {timeout:g} s", False) from None
      raise NoDispatcher(f"{code.name}: {e.details()}", False) from None


def ask_dispatcher(target: str, timeout: float) -> None:
  """Asks `[grpc://]host:port` for its version, as the service's clients do.

  A TCP connection proves too little: TensorFlow's worker waited silently
  at an address where another server listens (measured: over 10 minutes,
  its constructor holding the GIL, deaf to SIGTERM), and its client would
  be handed the same address. A dispatcher answers this call at once,
  another gRPC server with UNIMPLEMENTED, a server of another protocol not
  at all.

  Raises:
    NoDispatcher: Saying why, and whether nothing listens there.
  """
  _call(target, _GET_VERSION, timeout)


def check_reachable(runtime, timeout: float = 10.0) -> None:
  """Raises unless a dispatcher answers at `runtime.data_service`.

  TensorFlow's client retries an unreachable dispatcher forever, silently
  (measured: a run pointed at a closed port stayed at its first line).

  Raises:
    errors.ConfigError: Naming the address and what answers there.
  """
  port = address(runtime).rsplit(":", 1)[1]
  try:
    ask_dispatcher(address(runtime), timeout)
  except NoDispatcher as e:
    raise errors.ConfigError(
        f"no tf.data service dispatcher at {address(runtime)} "
        f"(`runtime.data_service`): {e.reason}; start one with "
        f"python scripts/data_service.py --port={port}") from None


_GET_WORKERS = "/tensorflow.data.DispatcherService/GetWorkers"


def _length_delimited(message: bytes, number: int) -> List[bytes]:
  """The values of field `number` (strings, messages) of a serialised
  protocol buffer.

  By hand: TensorFlow ships no Python module for the service's messages,
  and reading a worker list needs only the wire format's four rules.
  """
  def varint(i):
    value = shift = 0
    while True:
      byte = message[i]
      value |= (byte & 0x7f) << shift
      i, shift = i + 1, shift + 7
      if not byte & 0x80:
        return value, i

  values, i = [], 0
  while i < len(message):
    key, i = varint(i)
    wire_type = key & 7
    if wire_type == 0:
      _, i = varint(i)
    elif wire_type == 1:
      i += 8
    elif wire_type == 5:
      i += 4
    elif wire_type == 2:
      size, i = varint(i)
      if key >> 3 == number:
        values.append(message[i:i + size])
      i += size
    else:
      raise ValueError(f"unexpected wire type {wire_type}")
  return values


def list_workers(target: str, timeout: float = 5.0) -> List[str]:
  """Returns the addresses of the workers the dispatcher at
  `[grpc://]host:port` knows (`GetWorkers`, as `DispatchServer` asks).

  Raises:
    NoDispatcher: Where no dispatcher answers.
  """
  reply = _call(target, _GET_WORKERS, timeout)
  return sorted(info[0].decode() for info in (
      _length_delimited(worker, 1) for worker in _length_delimited(reply, 1))
                if info)


def unreachable_workers(target: str, timeout: float = 2.0) -> List[str]:
  """Returns the workers the dispatcher at `[grpc://]host:port` lists at
  whose address nothing answers (a dead worker).

  TensorFlow 2.20's dispatcher keeps a dead worker registered for good: its
  `worker_timeout_ms` only concerns snapshots (measured: a SIGKILLed worker
  still listed 60 s later with a 5 s timeout, 400 s later with the
  default). Readers go on with the other workers' tasks meanwhile (measured:
  no pause in reading). A live worker's gRPC server answers a dispatcher's
  call with UNIMPLEMENTED; nothing listens where one died.

  Raises:
    NoDispatcher: Where no dispatcher answers.
  """
  unreachable = []
  for worker in list_workers(target, timeout):
    try:
      _call(worker, _GET_VERSION, timeout)
    except NoDispatcher as e:
      if e.may_start:  # Nothing listens.
        unreachable.append(worker)
  return unreachable


# While a signal asks for a checkpoint, how long a loop may go without a
# new step before it is taken to wait for a batch; twice the slowest step
# the watch saw in this run where that is longer. A step through the
# service took ~25 ms in digits; the preemption grace period is 25 s.
SIGNAL_SECONDS = 2.0


class StallWatch:
  """Warns when training stops advancing while it reads from the service,
  and ends the wait after `runtime.data_service_timeout`, or at once on a
  signal.

  The service's client waits for batches as long as it takes: with no
  worker alive (none started yet, or all stopped) or the dispatcher down, a
  run would stay silent at its last line (measured), and the loop, blocked
  in `next` on the service's iterator, never comes back to save. This
  context runs a thread that prints one warning per stall, `seconds` inside
  training loops without a new step (twice as long before the first, which
  includes tracing; evaluations and saves between loops do not count), and
  calls `on_timeout` once a stall has lasted the timeout (doubled the same
  way). While `signalled_fn` says a signal asks for a checkpoint, a loop
  without a new step for `SIGNAL_SECONDS` (or twice its slowest step) waits
  for a batch: it calls `on_signal` instead of waiting for the loop (not
  before the first step, while the loop may still be tracing). It asks the
  dispatcher for its workers every `workers_seconds` while a loop runs, so
  that the end can name the ones it last saw.
  """

  def __init__(self, runtime, progress_fn: Callable[[], Optional[int]],
               on_timeout: Optional[Callable[[int, float, str], bool]] = None,
               seconds: float = 60.0, poll_seconds: float = 1.0,
               workers_seconds: float = 10.0,
               clock: Callable[[], float] = time.monotonic,
               workers_fn: Callable[[str], List[str]] = list_workers,
               signalled_fn: Callable[[], bool] = lambda: False,
               on_signal: Optional[Callable[[int, float, str], bool]] = None):
    """Creates the watch.

    Args:
      runtime: The `RuntimeConfig` naming the service and the timeout.
      progress_fn: Returns the step reached, read from the global step as
        it moves inside a loop, or None outside training loops.
      on_timeout: Called as `on_timeout(step, waited_seconds, why)` from
        the thread, `why` naming the dispatcher and its workers; it returns
        whether the run ends (False: training moved meanwhile). None: only
        warn.
      seconds: How long without a new step makes a stall.
      poll_seconds: How often the thread looks.
      workers_seconds: How often it asks the dispatcher for its workers.
      clock: Seconds, injectable for tests.
      workers_fn: Lists a dispatcher's workers (`list_workers`).
      signalled_fn: Returns whether a signal asks for a checkpoint.
      on_signal: Called as `on_timeout` is, when a signal asks for a
        checkpoint and the loop waits for a batch. None: the loop is waited
        for.
    """
    self._address = address(runtime)
    self._timeout = runtime.data_service_timeout if on_timeout else None
    self._on_timeout = on_timeout
    self._progress_fn = progress_fn
    self._seconds = seconds
    self._poll_seconds = poll_seconds
    self._workers_seconds = workers_seconds
    self._clock = clock
    self._workers_fn = workers_fn
    self._signalled_fn = signalled_fn
    self._on_signal = on_signal
    self._workers: Optional[List[str]] = None  # Last seen, and when.
    self._workers_at = self._asked_at = -float("inf")
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name="data_service_stall_watch")

  def __enter__(self) -> "StallWatch":
    self._thread.start()
    return self

  def __exit__(self, *unused_exc_info) -> None:
    self._stop.set()
    self._thread.join()

  def _watch(self) -> None:
    step, since, first, warned = self._progress_fn(), self._clock(), True, (
        False)
    slowest = 0.0  # The longest a trained step kept the step unchanged.
    while not self._stop.wait(self._poll_seconds):
      progress = self._progress_fn()
      if progress is None:  # Between loops: the input is not waited for.
        since = self._clock()
        continue
      self._ask_for_workers()
      if progress != step:
        if not first:
          slowest = max(slowest, self._clock() - since)
        # The first step seen starts the first loop: its patience stays
        # doubled until a step is trained.
        first = step is None
        step, since, warned = progress, self._clock(), False
        continue
      waited = self._clock() - since
      factor = 2 if first else 1
      if not warned and waited > factor * self._seconds:
        warned = True
        console.warning(
            f"training has not advanced from step {step} for {waited:.0f} "
            f"s; it reads its batches from the tf.data service at "
            f"{self._address}, which waits while the dispatcher is down or "
            "no worker is alive: start one with python "
            "scripts/data_service.py --port=PORT --dispatcher="
            f"{host_port(self._address)}")
      if (self._on_signal is not None and not first and
          waited > max(SIGNAL_SECONDS, 2 * slowest) and
          self._signalled_fn()):
        if self._on_signal(step, waited, self._why()):
          return
        since = self._clock()  # Its input came back meanwhile.
        continue
      if self._timeout is not None and waited > factor * self._timeout:
        if self._on_timeout(step, waited, self._why()):
          return
        since = self._clock()  # Its input came back meanwhile.

  def _ask_for_workers(self) -> None:
    """Asks the dispatcher for its workers, every `workers_seconds`."""
    if self._clock() - self._asked_at < self._workers_seconds:
      return
    self._asked_at = self._clock()
    try:
      workers = self._workers_fn(self._address)
    except NoDispatcher:
      return
    if workers:
      self._workers, self._workers_at = workers, self._clock()

  def _why(self) -> str:
    """Says what the dispatcher answers now, and the workers last seen."""
    try:
      workers = self._workers_fn(self._address)
    except NoDispatcher as e:
      return (f"the dispatcher at {self._address} does not answer "
              f"({e.reason}); {self._last_seen()}")
    if workers:
      return (f"the dispatcher at {self._address} has worker(s) "
              f"{', '.join(workers)}, which send none")
    return (f"the dispatcher at {self._address} has no worker; "
            f"{self._last_seen()}")

  def _last_seen(self) -> str:
    if not self._workers:
      return "no worker seen during this run"
    ago = self._clock() - self._workers_at
    return f"worker(s) last seen {ago:.0f} s ago: {', '.join(self._workers)}"


def timeout_line(runtime, step: int, waited: float, why: str,
                 saved: str) -> str:
  """The line a run ends with when no batch came in time."""
  return (f"no batch from the tf.data service for {waited:.0f} s at step "
          f"{step} (`runtime.data_service_timeout`): {why}; {saved}; start "
          "workers (python scripts/data_service.py --port=PORT --dispatcher="
          f"{host_port(address(runtime))}) and run the same command again")


def signal_reason(waited: float, why: str) -> str:
  """Why a signal's checkpoint was saved while the loop waits for a batch,
  for the preemption line."""
  return f"no batch from the tf.data service for {waited:.0f} s ({why})"
