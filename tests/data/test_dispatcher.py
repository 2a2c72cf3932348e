"""Asking a tf.data service dispatcher (`trainer.data.dispatcher`): only a
dispatcher answers as one, its workers are listed, and a run refuses an
address where none answers."""

import socket

import pytest
import tensorflow as tf

import helpers
import trainer
from trainer.data import dispatcher as dispatcher_lib
from trainer.data import service as data_service


def test_only_a_dispatcher_answers_as_one():
  # In-process servers: a dispatcher answers, a worker (another gRPC
  # server) and a plain TCP listener do not, a closed port may start one.
  service = tf.data.experimental.service
  dispatcher_port, worker_port, closed_port = helpers.free_ports(3)
  dispatcher = service.DispatchServer(
      service.DispatcherConfig(port=dispatcher_port))
  worker = service.WorkerServer(service.WorkerConfig(
      dispatcher_address=f"localhost:{dispatcher_port}", port=worker_port))
  with socket.create_server(("127.0.0.1", 0)) as listener:
    dispatcher_lib.ask_dispatcher(f"grpc://localhost:{dispatcher_port}", 5)
    # Its workers, as the stall watch reads them.
    assert dispatcher_lib.list_workers(
        f"grpc://localhost:{dispatcher_port}") == [f"localhost:{worker_port}"]
    answers = {}
    for name, port, timeout in [("worker", worker_port, 5),
                                ("listener", listener.getsockname()[1], 1),
                                ("closed", closed_port, 5)]:
      with pytest.raises(dispatcher_lib.NoDispatcher) as raised:
        dispatcher_lib.ask_dispatcher(f"127.0.0.1:{port}", timeout)
      answers[name] = (raised.value.reason, raised.value.may_start)
  worker.stop()
  dispatcher.stop()
  assert answers == {
      "worker": ("a gRPC server answers that is not a tf.data service "
                 "dispatcher (a worker's port?)", False),
      "listener": ("something listens there but gives no gRPC answer in "
                   "1 s", False),
      "closed": ("Connection refused", True)}
  runtime = trainer.RuntimeConfig(data_service=f"127.0.0.1:{worker_port}")
  with pytest.raises(trainer.ConfigError) as raised:
    data_service.check_reachable(runtime)
  assert str(raised.value) == (
      f"no tf.data service dispatcher at grpc://127.0.0.1:{worker_port} "
      "(`runtime.data_service`): Connection refused; start one with python "
      f"scripts/data_service.py --port={worker_port}")

