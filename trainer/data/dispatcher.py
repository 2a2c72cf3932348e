"""Talking to a tf.data service dispatcher: is one there, and its workers.

TensorFlow's client and worker wait for an unreachable dispatcher silently
(its client retries forever, its worker for an hour, deaf to SIGTERM), and
its Python API offers no call to list a dispatcher's workers. So the
trainer, the stall watch and `scripts/data_service.py` ask the dispatcher
themselves, over gRPC with empty requests, as the service's own clients do.
"""

from typing import List

_GET_VERSION = "/tensorflow.data.DispatcherService/GetVersion"
_GET_WORKERS = "/tensorflow.data.DispatcherService/GetWorkers"


def host_port(target: str) -> str:
  """Returns `host:port` of `[grpc://]host:port`."""
  return target.removeprefix("grpc://")


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


def _length_delimited(message: bytes, number: int) -> List[bytes]:
  """The values of field `number` (strings, messages) of a serialised
  protocol buffer.

  By hand: the reply's message (`GetWorkersResponse`, in TensorFlow's
  `core/data/service/dispatcher.proto`) has no Python module in the
  TensorFlow wheel (2.20 ships `data_service_pb2` and `service_config_pb2`
  only), and reading a worker list needs only the wire format's four rules.
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
