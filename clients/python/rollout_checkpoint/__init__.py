"""A Python client for rollout-checkpoint training runs (clients/python/README.md).

Config only (no Temporal SDK needed)::

    from rollout_checkpoint import load_run_config
    config = load_run_config("examples/run.yaml")  # every default applied, as RunConfigSchema.parse

Steering a run (``temporalio``)::

    from rollout_checkpoint.client import connect, resolve_target, start_run, run_status, checkpoint_now, stop_run, wait_for_run
"""

from .config import ConfigError, load_run_config, parse_run_config, run_config_json

__all__ = ["ConfigError", "load_run_config", "parse_run_config", "run_config_json"]
