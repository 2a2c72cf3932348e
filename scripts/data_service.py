"""Starts a tf.data service dispatcher or worker, and serves until stopped.

TensorFlow's tf.data service runs input pipelines away from the trainer: one
dispatcher hands each trainer's pipeline to the workers, and the workers
send the finished batches to the trainer. Start the dispatcher, then any
number of workers (on this host or others), then train with
`runtime.data_service` naming the dispatcher:

  python scripts/data_service.py --port=5050                 # dispatcher
  python scripts/data_service.py --port=5051 --dispatcher=HOST:5050  # worker
  python scripts/data_service.py --port=5052 --dispatcher=HOST:5050  # worker
  python train.py --gin_file=gin/digits.gin \\
      --gin_param='runtime.data_service="grpc://HOST:5050"' --model_dir=...

A worker tells the trainers it serves its address as `--host:--port`
(`--host` defaults to `localhost`: name this host as the trainers reach it
when they run elsewhere). The first line is `data_service | dispatcher
serving at grpc://...` or `data_service | worker serving at ...`; a
dispatcher then prints `data_service | dispatcher has N worker(s)` whenever
the count changes, and adds `, 1 unreachable: HOST:PORT ...` within 10 s
of a worker's death: TensorFlow's dispatcher keeps a dead worker registered
for good (its `worker_timeout_ms` only concerns snapshots: measured, a
SIGKILLed worker was still listed 60 s later with a 5 s timeout), while
trainers read from the other workers without a pause. So no timeout flag is
offered: none would drop it. A worker restarted on the same address is the
same worker again; one on a new address is one more. SIGTERM or SIGINT
stops the server (exit 0). A bad flag is one line on stderr and exit code
2, a busy port one line and exit code 1.

A worker first asks its dispatcher for its version, as the service's
clients do, and waits up to `--wait_for_dispatcher` seconds (default 60)
for one to answer, saying so once, so that workers may start first; an
address where something else answers (a worker's port) is refused at once.
Either ends in one line and exit code 1. (TensorFlow's worker itself waits
up to its `dispatcher_timeout_ms`, an hour, without a word and deaf to
SIGTERM: measured for 10 minutes.)

A dispatcher started with `--work_dir` keeps a journal there
(`fault_tolerant_mode`): restarted on the same port and directory, it
resumes the jobs it served, and trainers go on after a pause. Without one,
trainers wait while it is down and, when it comes back, go on with a new job
that reads their input from its first batch (`warning | the tf.data service
lost this run's job at step N ...`).
"""

import os
import signal
import socket
import sys
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))  # local-path: this repository
sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402  Selects Keras 2 before TensorFlow loads.
from absl import flags
import tensorflow as tf
from trainer.data import dispatcher as data_dispatcher
from trainer.report import tf_logs
from trainer.report import usage
from trainer.storage import files
# Registers tensorflow-text's ops, which text pipelines (ImdbSentiment)
# run on the workers.
import tensorflow_text  # noqa: F401  pylint: disable=unused-import

FLAGS = flags.FLAGS
flags.DEFINE_integer("port", None, "The port to serve on.", lower_bound=1,
                     upper_bound=65535)
flags.DEFINE_string("dispatcher", None, "The dispatcher's `host:port` (or "
                    "`grpc://host:port`): start a worker for it. Without "
                    "it, start a dispatcher.")
flags.DEFINE_string("host", "localhost", "This host's name as trainers "
                    "reach it; a worker gives trainers `host:port`.")
flags.DEFINE_string("work_dir", None, "A dispatcher's journal directory: "
                    "with it, a dispatcher restarted on the same port and "
                    "directory resumes the jobs it served "
                    "(`fault_tolerant_mode`).")
flags.DEFINE_float("wait_for_dispatcher", 60.0, "How long a worker waits "
                   "for its dispatcher to answer, in seconds.",
                   lower_bound=0.0)
flags.mark_flag_as_required("port")

PROGRAM = "data_service.py"
ERROR_EXIT_CODE = 1


def check_port_free(port: int) -> None:
  """Raises if another process listens on `port`.

  gRPC servers share ports (SO_REUSEPORT): TensorFlow would start a second
  dispatcher on a busy port without a word, and the trainers would reach
  either one.

  Raises:
    OSError: "port N is in use".
  """
  with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
    # Connections of a server stopped a moment ago (TIME_WAIT) do not count.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(("::", port))
    except OSError as e:
      raise OSError(f"port {port} is in use ({e.strerror})") from e


def start_server(port: int, dispatcher: str, host: str, work_dir: str):
  """Starts a dispatcher (no `dispatcher`) or a worker; returns it and the
  line to print."""
  service = tf.data.experimental.service
  if not dispatcher:
    if work_dir:  # TensorFlow writes the journal, at a URL too.
      files.check_path(work_dir, "--work_dir")
    server = service.DispatchServer(service.DispatcherConfig(
        port=port, work_dir=work_dir, fault_tolerant_mode=bool(work_dir)))
    journal = f" (journal in {work_dir})" if work_dir else ""
    return server, f"dispatcher serving at {server.target}{journal}"
  dispatcher = data_dispatcher.host_port(dispatcher)
  server = service.WorkerServer(service.WorkerConfig(
      dispatcher_address=dispatcher, worker_address=f"{host}:{port}",
      port=port))
  return server, (f"worker serving at {host}:{port} for dispatcher "
                  f"{dispatcher}")


def wait_for_dispatcher(dispatcher: str, stop: threading.Event) -> bool:
  """Waits until `dispatcher` answers, up to `--wait_for_dispatcher` s.

  Says once that it waits. Returns False if `stop` is set first.

  Raises:
    data_dispatcher.NoDispatcher: At once where something else answers, or
      when the time is up.
  """
  deadline = time.monotonic() + FLAGS.wait_for_dispatcher
  said = False
  while True:
    try:
      data_dispatcher.ask_dispatcher(dispatcher, timeout=5.0)
      return True
    except data_dispatcher.NoDispatcher as e:
      if not e.may_start:
        raise
      if time.monotonic() >= deadline:
        raise data_dispatcher.NoDispatcher(
            f"{e.reason} for {FLAGS.wait_for_dispatcher:g} s "
            "(--wait_for_dispatcher)", True) from None
      if not said:
        print(f"data_service | waiting for dispatcher {dispatcher} "
              f"({e.reason})", flush=True)
        said = True
    if stop.wait(1.0):
      return False


class WorkerReport:
  """A dispatcher's line whenever its workers change: how many are
  registered and, checked every `PROBE_SECONDS`, which of them nothing
  answers at (TensorFlow keeps a dead worker registered for good; see
  `trainer.data.dispatcher.unreachable_workers`)."""

  PROBE_SECONDS = 10.0

  def __init__(self, server):
    self._server = server
    self._last = (0, [])
    self._next_probe = 0.0

  def update(self) -> None:
    """Prints the line if the count or the unreachable workers changed."""
    count = self._server._num_workers()  # pylint: disable=protected-access
    unreachable = self._last[1]
    now = time.monotonic()
    if count != self._last[0] or (count and now >= self._next_probe):
      self._next_probe = now + self.PROBE_SECONDS
      try:
        unreachable = data_dispatcher.unreachable_workers(self._server.target)
      except data_dispatcher.NoDispatcher:
        return  # Its own dispatcher busy: asked again next time.
    if (count, unreachable) == self._last:
      return
    self._last = (count, unreachable)
    line = f"data_service | dispatcher has {count} worker(s)"
    if unreachable:
      line += (f", {len(unreachable)} unreachable: {', '.join(unreachable)} "
               "(TensorFlow keeps a dead worker registered; trainers read "
               "from the others)")
    print(line, flush=True)


def main(argv) -> int:
  """Starts the server `--dispatcher` asks for and serves until a signal;
  returns the exit code."""
  if len(argv) > 1:
    print(f"{PROGRAM}: error: unexpected arguments: {' '.join(argv[1:])}",
          file=sys.stderr, flush=True)
    return 2
  # A worker whose dispatcher is down says so once a second otherwise.
  tf_logs.apply_min_log_level_to_absl()
  stop = threading.Event()
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda *_: stop.set())
  try:
    check_port_free(FLAGS.port)
    if FLAGS.dispatcher and not wait_for_dispatcher(FLAGS.dispatcher, stop):
      print("data_service | stopped", flush=True)
      return 0
    server, line = start_server(FLAGS.port, FLAGS.dispatcher, FLAGS.host,
                                FLAGS.work_dir)
  except data_dispatcher.NoDispatcher as e:
    print(f"{PROGRAM}: error: no tf.data service dispatcher at "
          f"{FLAGS.dispatcher}: {e.reason}", file=sys.stderr, flush=True)
    return ERROR_EXIT_CODE
  except (OSError, tf.errors.OpError, RuntimeError, ValueError) as e:
    message = (str(e).strip().splitlines() or [type(e).__name__])[0]
    print(f"{PROGRAM}: error: {message}", file=sys.stderr, flush=True)
    return ERROR_EXIT_CODE
  print(f"data_service | {line}", flush=True)
  # The servers run on TensorFlow's threads; the main thread only waits,
  # in short slices, so that a signal is handled at once.
  report = None if FLAGS.dispatcher else WorkerReport(server)
  while not stop.wait(0.5):
    if report:
      report.update()
  print("data_service | stopped", flush=True)
  # Not `server.stop()`: a worker's shutdown waits for the jobs it serves
  # (measured: a worker serving a live trainer was still up 30 s after
  # SIGTERM). The process's end closes its connections.
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  usage.exit_if_requested(sys.argv, __doc__)
  try:
    parsed = FLAGS(sys.argv)
  except flags.Error as error:  # One line, as every script's bad flag.
    print(f"{PROGRAM}: error: {str(error).splitlines()[0]}", file=sys.stderr,
          flush=True)
    sys.exit(2)
  sys.exit(main(parsed))
