"""The tf.data service's stall watch (`trainer.data.stall_watch`), on an
injected clock: one warning per stall, the timeout's end naming the
workers, and a signal that ends a wait for a batch."""

import time

import trainer
from trainer.data import dispatcher
from trainer.data import stall_watch


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def test_a_stall_is_warned_about_once_until_training_moves(capsys):
  clock, step = _Clock(), [None]  # It starts before the first loop.
  runtime = trainer.RuntimeConfig(data_service="grpc://10.0.0.5:5050")
  warning = stall_watch.StallWatch(runtime, lambda: step[0], seconds=60,
                                   poll_seconds=0.01, clock=clock,
                                   workers_fn=lambda address: [])
  with warning:
    time.sleep(0.1)
    step[0] = 0  # The first loop begins.
    time.sleep(0.1)
    clock.now = 119.0  # Before the first step: twice the patience.
    time.sleep(0.1)
    assert "warning" not in capsys.readouterr().out
    clock.now = 121.0
    time.sleep(0.1)
    clock.now = 500.0
    time.sleep(0.1)
    out = capsys.readouterr().out
    assert out.count("warning | training has not advanced from step 0 for "
                     "121 s; it reads its batches from the tf.data service "
                     "at grpc://10.0.0.5:5050, which waits while the "
                     "dispatcher is down or no worker is alive: start one "
                     "with python scripts/data_service.py --port=PORT "
                     "--dispatcher=10.0.0.5:5050") == 1
    assert out.count("warning") == 1
    step[0] = 100  # Trained on: the next stall counts 60 s.
    time.sleep(0.1)
    step[0] = None  # Between loops (an evaluation): not a stall.
    clock.now = 700.0
    time.sleep(0.1)
    assert "warning" not in capsys.readouterr().out
    step[0] = 100
    time.sleep(0.1)
    clock.now = 761.0
    time.sleep(0.1)
  assert "from step 100 for 61 s" in capsys.readouterr().out


def test_a_stall_past_the_timeout_ends_the_run_naming_the_workers(capsys):
  clock, step, ended = _Clock(), [None], []
  answers = [["127.0.0.1:5051", "127.0.0.1:5052"], []]

  def workers(address):
    assert address == "grpc://127.0.0.1:5050"
    if not answers:
      raise dispatcher.NoDispatcher("Connection refused", True)
    return answers[0]

  runtime = trainer.RuntimeConfig(data_service="grpc://127.0.0.1:5050",
                                  data_service_timeout=300)
  watch = stall_watch.StallWatch(
      runtime, lambda: step[0], lambda *args: ended.append(args) or True,
      seconds=60, poll_seconds=0.01, clock=clock, workers_fn=workers)
  with watch:
    step[0] = 0
    time.sleep(0.1)
    step[0] = 200  # Trained: the timeout counts once, not twice.
    time.sleep(0.1)
    clock.now = 30.0
    answers.pop(0)  # The workers are gone.
    time.sleep(0.1)
    clock.now = 299.0
    time.sleep(0.1)
    assert not ended
    answers.pop(0)  # The dispatcher too.
    clock.now = 301.0
    time.sleep(0.1)
  assert ended == [(200, 301.0, (
      "the dispatcher at grpc://127.0.0.1:5050 does not answer (Connection "
      "refused); worker(s) last seen 301 s ago: 127.0.0.1:5051, "
      "127.0.0.1:5052"))]
  assert stall_watch.timeout_line(
      runtime, 200, 301.0, "WHY", "the checkpoint of step 200 is saved") == (
          "no batch from the tf.data service for 301 s at step 200 "
          "(`runtime.data_service_timeout`): WHY; the checkpoint of step 200 "
          "is saved; start workers (python scripts/data_service.py "
          "--port=PORT --dispatcher=127.0.0.1:5050) and run the same "
          "command again")


def test_a_timeout_whose_save_a_batch_overtook_waits_a_whole_timeout_again():
  # `on_timeout` returns False when a batch came during its save (the
  # controller's `save_while_waiting` returns None): the watch waits again.
  clock, step, calls = _Clock(), [None], []
  runtime = trainer.RuntimeConfig(data_service="grpc://127.0.0.1:5050",
                                  data_service_timeout=100)
  watch = stall_watch.StallWatch(
      runtime, lambda: step[0],
      lambda *args: calls.append((args[0], clock.now)) or len(calls) > 1,
      seconds=60, poll_seconds=0.01, clock=clock,
      workers_fn=lambda address: [])
  with watch:
    step[0] = 0
    time.sleep(0.1)
    step[0] = 5
    time.sleep(0.1)
    clock.now = 101.0
    time.sleep(0.1)
    assert calls == [(5, 101.0)]
    clock.now = 200.0  # Less than a whole timeout since the first call.
    time.sleep(0.1)
    assert calls == [(5, 101.0)]
    clock.now = 202.0
    time.sleep(0.1)
  assert calls == [(5, 101.0), (5, 202.0)]


def test_a_signal_ends_a_stall_without_waiting_for_the_timeout():
  # A signal asks for a checkpoint: a loop without a new step for
  # `SIGNAL_SECONDS` (or twice its slowest step) waits for a batch, and the
  # watch ends the wait; not before the first step (the loop may trace).
  clock, step, signalled, calls = _Clock(), [None], [False], []
  runtime = trainer.RuntimeConfig(data_service="grpc://127.0.0.1:5050")
  watch = stall_watch.StallWatch(
      runtime, lambda: step[0], lambda *args: calls.append(("timeout",) + args),
      seconds=60, poll_seconds=0.01, clock=clock,
      workers_fn=lambda address: ["127.0.0.1:5051"],
      signalled_fn=lambda: signalled[0],
      on_signal=lambda *args: calls.append(("signal",) + args) or (
          len(calls) > 1))
  with watch:
    step[0] = 0  # The first loop begins: it traces.
    signalled[0] = True
    clock.now = 10.0
    time.sleep(0.1)
    assert not calls  # Before the first step.
    step[0] = 100  # Trained, at the first step's pace.
    time.sleep(0.1)
    clock.now = 13.0
    step[0] = 130  # 3 s without a new step: the slowest step so far.
    time.sleep(0.1)
    clock.now = 18.5
    time.sleep(0.1)
    assert not calls  # Within twice the slowest step.
    clock.now = 19.5
    time.sleep(0.1)
    # The batch came during the save: the wait starts again.
    assert calls == [("signal", 130, 6.5, (
        "the dispatcher at grpc://127.0.0.1:5050 has worker(s) "
        "127.0.0.1:5051, which send none"))]
    clock.now = 25.0
    time.sleep(0.1)
    assert len(calls) == 1
    clock.now = 26.0
    time.sleep(0.1)
  assert [call[:3] for call in calls] == [("signal", 130, 6.5),
                                          ("signal", 130, 6.5)]
