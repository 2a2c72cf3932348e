"""The outer loop: the controller and what it decides with (checkpoint
saves, rollback, the loop hooks: progress line, profile window), the
interface of the preemption watcher it is given (`watcher`), and
continuous evaluation."""
