"""Orbit's own controller tests (`orbit/controller_test.py`, shipped with
tf-models-official), run against our `Controller`, twice.

With plain Orbit runners (no `loop_status`) our Controller must behave as
Orbit's: an Orbit user can bring their own `StandardTrainer`, which our one
loop drives through `orbit_adapter.OrbitRunnerAdapter`.

With the same runners given the capabilities that switch on our own loop
(`loop_status`, `discard_batch`, `read_and_reset_metrics`, `in_loop`), built
on each runner's own `train`, our fast loop must keep Orbit's contract:
summaries in `summary_dir` at `summary_interval`, saves at the checkpoint
manager's interval, the runner's output to the train actions.
"""

import collections
import importlib.util
import math
import types

from orbit import controller as orbit_controller
from orbit import controller_test
import tensorflow as tf

from trainer.loop.control import controller as controller_lib
from trainer.loop.runner import orbit_adapter
from trainer.loop.runner import runners

# The test module builds every controller as `controller.Controller(...)`
# (and subclasses it once) and reads Orbit's usage gauge from the same
# module: give it Orbit's module with our Controller in it.
_ours = types.ModuleType(orbit_controller.__name__)
_ours.__dict__.update(vars(orbit_controller))
_ours.Controller = controller_lib.Controller
controller_test.controller = _ours


# Orbit's tests that build a trainer but never train (or build none).
_NOT_TRAINING = ("test_already_trained_model", "test_evaluate_only",
                 "test_no_eval_steps", "test_evaluate_with_loss_output",
                 "test_evaluate_with_no_output",
                 "test_evaluate_with_nested_summaries")

def _check_every_loop_was_ours(test, calls: collections.Counter) -> None:
  """Every loop went through our loop, which reads the status once; a test
  that trains trained."""
  name = test._testMethodName  # pylint: disable=protected-access
  test.assertEqual(calls["loop_status"], calls["train"], name)
  if name.startswith(_NOT_TRAINING):
    test.assertEqual(calls["train"], 0, name)
  else:
    test.assertGreater(calls["train"], 0, name)


class OrbitControllerTest(controller_test.ControllerTest):
  """Every test of `orbit.controller_test.ControllerTest`, on ours: each
  test that trains takes our loop, through the adapter, for every loop."""

  def setUp(self):
    super().setUp()
    self._adapter_calls = collections.Counter()
    adapter = orbit_adapter.OrbitRunnerAdapter
    self._adapter_methods = {name: getattr(adapter, name)
                             for name in ("train", "loop_status")}
    for name, method in self._adapter_methods.items():

      def counted(runner, *args, _name=name, _method=method):
        self._adapter_calls[_name] += 1
        return _method(runner, *args)

      setattr(adapter, name, counted)

  def tearDown(self):
    for name, method in self._adapter_methods.items():
      setattr(orbit_adapter.OrbitRunnerAdapter, name, method)
    _check_every_loop_was_ours(self, self._adapter_calls)
    super().tearDown()


def test_the_orbit_tests_build_our_controller():
  built = controller_test.controller.Controller
  assert built is controller_lib.Controller
  assert issubclass(built, orbit_controller.Controller)


# A second copy of Orbit's test module, whose runners get the fast loop's
# capabilities; the first copy keeps its plain runners.
_spec = importlib.util.spec_from_file_location(
    "orbit_controller_test_fast_loop", controller_test.__file__)
fast_test = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fast_test)
fast_test.controller = _ours

# Per test: calls of a capable runner's `train`, and of its `loop_status`,
# which only our own loop reads (once per loop).
_calls = collections.Counter()


class _FastLoopCapabilities:
  """What switches our Controller to its own loop, on the runner's own
  `train` and its own `train_loss` metric (both Orbit test trainers keep
  one): the loop's status is that metric, as the runner's output is."""

  in_loop = False

  def train(self, num_steps):
    _calls["train"] += 1
    self.in_loop = True
    try:
      return super().train(num_steps)
    finally:
      self.in_loop = False

  def loop_status(self) -> runners.LoopStatus:
    _calls["loop_status"] += 1
    loss = float(self.train_loss.result())
    # The runner cannot tell which step of a loop went wrong: the last.
    nonfinite_step = -1 if math.isfinite(loss) else int(
        self.global_step.numpy())
    return runners.LoopStatus(loss, nonfinite_step, learning_rate=None)

  def discard_batch(self) -> None:
    if self._train_iter is None:  # As `StandardTrainer.train` makes it.
      self._train_iter = tf.nest.map_structure(iter, self.train_dataset)
    next(self._train_iter)

  def read_and_reset_metrics(self):
    results = {"loss": float(self.train_loss.result())}
    self.train_loss.reset_state()
    return results


class FastTestRunner(_FastLoopCapabilities, controller_test.TestRunner):
  """Orbit's `TestRunner`, with the fast loop's capabilities."""


class FastTestTrainerWithSummaries(_FastLoopCapabilities,
                                   controller_test.TestTrainerWithSummaries):
  """Orbit's `TestTrainerWithSummaries`, with the fast loop's capabilities."""


fast_test.TestRunner = FastTestRunner
fast_test.TestTrainerWithSummaries = FastTestTrainerWithSummaries


class OrbitControllerFastLoopTest(fast_test.ControllerTest):
  """Every test of `orbit.controller_test.ControllerTest`, on our own loop:
  each test that trains takes it for every loop."""

  def setUp(self):
    super().setUp()
    _calls.clear()

  def tearDown(self):
    _check_every_loop_was_ours(self, _calls)
    super().tearDown()


def test_the_fast_loop_copy_has_capable_runners():
  assert fast_test.controller.Controller is controller_lib.Controller
  assert callable(fast_test.TestRunner().loop_status)
  # The first copy keeps Orbit's plain runners.
  assert not hasattr(controller_test.TestRunner(), "loop_status")
