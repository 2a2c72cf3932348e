"""The outer loop: the controller and what it decides with (checkpoint
saves, rollback, the loop hooks: progress line, profile window) and
continuous evaluation."""
