"""Orbit's own controller tests (`orbit/controller_test.py`, shipped with
tf-models-official), run against our `Controller`.

With plain Orbit runners (no `loop_status`) our Controller must behave as
Orbit's: an Orbit user can bring their own `StandardTrainer`.
"""

import types

from orbit import controller as orbit_controller
from orbit import controller_test

from trainer import controller as controller_lib

# The test module builds every controller as `controller.Controller(...)`
# (and subclasses it once) and reads Orbit's usage gauge from the same
# module: give it Orbit's module with our Controller in it.
_ours = types.ModuleType(orbit_controller.__name__)
_ours.__dict__.update(vars(orbit_controller))
_ours.Controller = controller_lib.Controller
controller_test.controller = _ours


class OrbitControllerTest(controller_test.ControllerTest):
  """Every test of `orbit.controller_test.ControllerTest`, on ours."""



def test_the_orbit_tests_build_our_controller():
  built = controller_test.controller.Controller
  assert built is controller_lib.Controller
  assert issubclass(built, orbit_controller.Controller)
