"""The Python client's command line, the verbs of ``npm run run`` (scripts/run.ts):

    python -m rollout_checkpoint <verb> <arg> [--address HOST:PORT] [--namespace NS] [--connect-timeout-s N]

Exit status: 0 done; 1 the verb failed (Temporal unreachable, no such run, run already finished,
the run failed); 2 a usage or run config error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from .config import ConfigError, load_run_config, to_json

PROG = "rollout_checkpoint"

VERBS = {
    "start": ("<config.yaml>", "start a training run from a run config (examples/run.yaml); its workflow ID is run.name"),
    "status": ("<run>", "print the running run's status (the `status` query) as JSON"),
    "checkpoint-now": ("<run>", "take a checkpoint now and print its outcome as JSON (the `checkpointNow` update); also `checkpoint`"),
    "stop": ("<run>", "ask the run to stop: no new rollouts; it finishes those in flight, then ends"),
    "wait": (
        "<run>",
        "wait for the run to end and print its summary as JSON; on a terminal, a progress line meanwhile. "
        "A run that failed prints its failure and every cause (type and message), one line each",
    ),
    "config": ("<config.yaml>", "print the run config with every default applied, as the workflow receives it (no server needed)"),
}
ALIASES = {"checkpoint": "checkpoint-now"}


def _parser() -> argparse.ArgumentParser:
    verbs = "\n".join(f"  {name} {arg}\n      {text}" for name, (arg, text) in VERBS.items())
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="The controller client: starts a training run on Temporal and steers it. "
        "The worker (`npm run worker`) must be running for a run to make progress.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"verbs:\n{verbs}\n\nenvironment:\n  TEMPORAL_ADDRESS  the Temporal frontend, when --address is not given\n\n"
        "status, checkpoint-now and stop need a running run; on a finished or unknown one they say so and exit 1,\n"
        "as status and checkpoint-now do when no worker takes the query or update within 10 s.\n"
        "Exit status: 0 done; 1 the verb failed; 2 a usage or run config error.",
    )
    p.add_argument("verb", choices=[*VERBS, *ALIASES], metavar="verb", help="one of: " + ", ".join(VERBS))
    p.add_argument("arg", help="the run config file (start, config) or the run's name")
    p.add_argument("--address", metavar="HOST:PORT", help="the Temporal frontend (default: $TEMPORAL_ADDRESS, else 127.0.0.1:7233)")
    p.add_argument("--namespace", metavar="NS", default="default", help="the Temporal namespace (default: default)")
    p.add_argument("--connect-timeout-s", metavar="N", type=float, default=2.0, help="give up reaching the Temporal server after N seconds (default: 2)")
    return p


def _print_json(value: Any) -> None:
    # JSON.stringify(value, null, 2): the same text as `npm run run` prints.
    print(to_json(value, indent=2))


async def _run(verb: str, arg: str, args: argparse.Namespace, config: dict | None) -> None:
    # The SDK is imported only for the verbs that talk to Temporal: `config` needs none of it.
    from . import client as c

    target = c.resolve_target(args.address)
    client = await c.connect(target, args.namespace, args.connect_timeout_s)
    try:
        await _verb(c, client, verb, arg, config)
    except c.NamespaceNotFoundError:
        raise c.RunClientError(f"no namespace {args.namespace} on the Temporal server at {target.address} ({target.source})") from None


async def _verb(c: Any, client: Any, verb: str, arg: str, config: dict | None) -> None:
    if verb == "start":
        assert config is not None
        handle = await c.start_run(client, config)
        print(f"started run {handle.id} (run id {handle.first_execution_run_id})")
    elif verb == "status":
        _print_json(await c.run_status(client, arg))
    elif verb == "checkpoint-now":
        _print_json(await c.checkpoint_now(client, arg))
    elif verb == "stop":
        await c.stop_run(client, arg)
        print(f"asked run {arg} to stop")
    elif verb == "wait":
        _print_json(await c.wait_for_run(client, arg))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    verb = ALIASES.get(args.verb, args.verb)
    if not args.connect_timeout_s > 0:
        parser.error("--connect-timeout-s must be a positive number of seconds")
    try:
        # A bad config fails before any connection is tried.
        config = load_run_config(args.arg) if verb in ("start", "config") else None
    except ConfigError as err:
        print(f"{PROG}: config error: {err}", file=sys.stderr)
        return 2
    if verb == "config":
        print(to_json(config))
        return 0
    from .client import RunClientError, failure_lines

    try:
        asyncio.run(_run(verb, args.arg, args, config))
    except RunClientError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 (one line per cause, no stack)
        print(f"{PROG}: " + "\n  ".join(failure_lines(err)), file=sys.stderr)
        return 1
    return 0


def run() -> None:
    """The command (``python -m rollout_checkpoint``, or ``rollout-checkpoint`` when installed)."""
    try:
        code = main()
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
        code = 1
    # os._exit, not sys.exit: the SDK's Rust threads can still call into Python while the interpreter
    # finalizes, which aborts a finished command now and then ("PyGILState_Release: thread state ...
    # must be current", temporalio/sdk-python#300). Nothing is left to clean up here.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        pass
    finally:
        os._exit(code)


if __name__ == "__main__":
    run()
