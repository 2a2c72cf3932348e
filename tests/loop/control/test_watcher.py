"""The controller's watcher interface: the preemption watcher the command
line builds satisfies it, and the controller calls nothing else on it."""

import inspect
import re

from trainer import preemption
from trainer.loop.control import controller as controller_lib
from trainer.loop.control import watcher as watcher_lib


def _members(protocol) -> set:
  return {name for name in vars(protocol)
          if not name.startswith("_")}


def test_the_preemption_watcher_is_a_watcher():
  assert isinstance(preemption.PreemptionWatcher(), watcher_lib.Watcher)
  assert _members(watcher_lib.Watcher) == {
      "armed", "is_armed", "received", "agreed", "stopped"}
  for name in _members(watcher_lib.Watcher):
    assert hasattr(preemption.PreemptionWatcher, name), name


def test_an_object_without_a_member_is_no_watcher():
  class NoAgreement:
    armed = is_armed = received = stopped = None
  assert not isinstance(NoAgreement(), watcher_lib.Watcher)


def test_the_controller_calls_only_the_watcher_interface():
  source = inspect.getsource(controller_lib)
  called = set(re.findall(r"self\._preemption\.(\w+)", source))
  assert called == _members(watcher_lib.Watcher)
