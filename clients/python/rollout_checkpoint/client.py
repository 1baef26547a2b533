"""Starting and steering a training run on Temporal, as scripts/run.ts does from TypeScript.

The run is the ``trainingRun`` workflow (workflow ID = ``run.name``) on ``run.task_queue``; its
messages are in workflows/messages.ts: the ``status`` query, the ``checkpointNow`` update and the
``stop`` signal. A worker (``npm run worker``) must poll that task queue for a run to make progress.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.common import RawValue, WorkflowIDReusePolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    TerminatedError,
    TimeoutError as TemporalTimeoutError,
    WorkflowAlreadyStartedError,
)
from temporalio.service import RPCError, RPCStatusCode

from .config import _js_number_text, run_config_json

DEFAULT_ADDRESS = "127.0.0.1:7233"
WORKFLOW_TYPE = "trainingRun"
STATUS_QUERY = "status"
CHECKPOINT_UPDATE = "checkpointNow"
STOP_SIGNAL = "stop"
# How long a query or an update may wait for a worker to take it (scripts/run.ts WORKER_WAIT_MS).
WORKER_WAIT_S = 10.0
# A call's own deadline, past WORKER_WAIT_S so that the wait above ends it first: an RPC timeout
# surfaces as a transport error ("Timeout expired", "h2 protocol error"), not as a timeout.
_RPC_TIMEOUT = timedelta(seconds=WORKER_WAIT_S + 5)
# The run keeps its last this many checkpoint outcomes (workflows/run/state.ts MAX_KEPT_OUTCOMES).
MAX_KEPT_OUTCOMES = 50


class RunClientError(Exception):
    """A failure explained in sentences for the user (the CLI prints it as is and exits 1)."""


class NamespaceNotFoundError(RunClientError):
    """The client's namespace does not exist on the server."""


@dataclass
class Target:
    address: str
    source: str
    """Where the address came from, for messages."""


def resolve_target(address: str | None = None) -> Target:
    """``address``, else $TEMPORAL_ADDRESS, else 127.0.0.1:7233."""
    if address:
        return Target(address, "--address")
    if os.environ.get("TEMPORAL_ADDRESS"):
        return Target(os.environ["TEMPORAL_ADDRESS"], "TEMPORAL_ADDRESS")
    return Target(DEFAULT_ADDRESS, "the default; set --address or TEMPORAL_ADDRESS")


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text).strip()


async def _tcp_problem(address: str, timeout_s: float) -> str | None:
    """Why nothing answers at host:port, from a plain TCP connection; None if it connects."""
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)", address) or re.fullmatch(r"([^:/]+):(\d+)", address)
    if not m:
        return None
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(m[1], int(m[2])), timeout_s)
    except asyncio.TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as err:
        if "Name or service not known" in str(err) or "nodename nor servname" in str(err):
            return f"cannot resolve host {m[1]}"
        return _one_line(str(err))
    writer.close()
    return None


async def connect(target: Target, namespace: str = "default", timeout_s: float = 2.0) -> Client:
    """Connects within ``timeout_s``, or fails naming the address, where it came from, and why."""
    # Alongside the connection, not after it: a failed connect only says that it failed.
    problem = asyncio.ensure_future(_tcp_problem(target.address, timeout_s))
    try:
        return await asyncio.wait_for(Client.connect(target.address, namespace=namespace), timeout_s)
    except Exception as err:  # noqa: BLE001 (every failure to connect gets the same sentence)
        why = await problem or f"it accepts connections but gave no Temporal answer within {timeout_s:g} s ({_one_line(str(err) or type(err).__name__)})"
        raise RunClientError(f"cannot reach the Temporal server at {target.address} ({target.source}): {why}") from None
    finally:
        problem.cancel()


def _count(x: Any) -> str:
    return _js_number_text(float(x)) if isinstance(x, (int, float)) else str(x)


async def start_run(client: Client, config: dict) -> WorkflowHandle:
    """Starts ``trainingRun`` with ``[{config}]`` as scripts/run.ts ``startRun`` does.

    The input goes as a raw JSON payload written like ``JSON.stringify``: the SDK's own JSON
    converter sorts object keys, and the workflow then gets the same config in another order.
    """
    run, grpo, ckpt = config["run"], config["grpo"], config["rollout_checkpointing"]
    interval = ckpt["snapshot_attempt_interval_s"]
    payload = Payload(metadata={"encoding": b"json/plain"}, data=run_config_json({"config": config}).encode("utf-8"))
    try:
        return await client.start_workflow(
            WORKFLOW_TYPE,
            RawValue(payload),
            id=run["name"],
            # A name is taken once: the run's attempts are named after it (scripts/run.ts startRun).
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            task_queue=run["task_queue"],
            memo={"run": run["name"]},
            static_summary=f"training run {run['name']}",
            static_details=(
                f"{_count(grpo['max_num_steps'])} steps × {_count(grpo['num_prompts_per_step'])} prompts × "
                f"{_count(grpo['num_generations_per_prompt'])} generations over {', '.join(grpo['tasksets'])}; "
                f"checkpoints every {'—' if interval is None else _count(interval)} s into `{run['checkpoint_dir']}`"
            ),
        )
    except WorkflowAlreadyStartedError:
        raise await _taken_name_error(client, run["name"]) from None
    except RPCError as err:
        if _namespace_not_found(err):
            raise NamespaceNotFoundError(f"no namespace {client.namespace} on the Temporal server") from None
        raise


async def _taken_name_error(client: Client, name: str) -> RunClientError:
    """Why ``name`` cannot be started: a run under it is still running, or one has already run."""
    try:
        status = (await client.get_workflow_handle(name).describe()).status
    except RPCError:
        status = None
    if status is None or status == WorkflowExecutionStatus.RUNNING:
        return RunClientError(f"a run named {name} is already running")
    return RunClientError(
        f"a run named {name} has already run ({status.name}); a name is used once, "
        "as its attempts are named after it: set run.name to a new name"
    )


def _not_found(err: BaseException) -> bool:
    return isinstance(err, RPCError) and err.status == RPCStatusCode.NOT_FOUND


def _namespace_not_found(err: BaseException) -> bool:
    return _not_found(err) and any("NamespaceNotFound" in d.type_url for d in err.grpc_status.details)  # type: ignore[union-attr]


async def describe_run(client: Client, run: str) -> WorkflowExecutionDescription:
    try:
        return await client.get_workflow_handle(run).describe()
    except RPCError as err:
        if _namespace_not_found(err):
            raise NamespaceNotFoundError(f"no namespace {client.namespace} on the Temporal server") from None
        if _not_found(err):
            raise RunClientError(f"no run named {run} (namespace {client.namespace})") from None
        raise


async def _require_running(client: Client, run: str) -> WorkflowExecutionDescription:
    d = await describe_run(client, run)
    if d.status != WorkflowExecutionStatus.RUNNING:
        raise RunClientError(f"run {run} has already finished ({d.status.name if d.status else 'UNKNOWN'})")
    return d


async def _on_running_run(client: Client, run: str, fn: Any) -> Any:
    """Runs ``fn()`` on a running run; a run that ended meanwhile, or no worker taking it within 10 s, is explained."""
    d = await _require_running(client, run)
    try:
        return await asyncio.wait_for(fn(), WORKER_WAIT_S)
    except (asyncio.TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
        raise RunClientError(
            f"run {run} is running, but no worker answered within {WORKER_WAIT_S:g} s: "
            f"is a worker (npm run worker) polling its task queue {d.task_queue}?"
        ) from None
    except RPCError as err:
        if err.status == RPCStatusCode.DEADLINE_EXCEEDED:
            raise RunClientError(
                f"run {run} is running, but no worker answered within {WORKER_WAIT_S:g} s: "
                f"is a worker (npm run worker) polling its task queue {d.task_queue}?"
            ) from None
        if _not_found(err):
            await _require_running(client, run)
        raise


async def run_status(client: Client, run: str) -> dict:
    """The running run's status (the ``status`` query, workflows/messages.ts ``RunStatus``)."""
    handle = client.get_workflow_handle(run)
    return await _on_running_run(client, run, lambda: handle.query(STATUS_QUERY, rpc_timeout=_RPC_TIMEOUT))


async def checkpoint_now(client: Client, run: str) -> dict:
    """Takes a checkpoint now and returns its outcome (the ``checkpointNow`` update)."""
    handle = client.get_workflow_handle(run)
    # Only its acceptance is bounded: the checkpoint itself may take minutes.
    update = await _on_running_run(
        client,
        run,
        lambda: handle.start_update(CHECKPOINT_UPDATE, wait_for_stage=WorkflowUpdateStage.ACCEPTED, rpc_timeout=_RPC_TIMEOUT),
    )
    return await update.result()


async def stop_run(client: Client, run: str) -> None:
    """Asks the run to stop: no new rollouts; it finishes those in flight, then ends (the ``stop`` signal)."""
    handle = client.get_workflow_handle(run)
    await _on_running_run(client, run, lambda: handle.signal(STOP_SIGNAL))


def _failure_line(err: BaseException) -> str:
    """One line for one failure of a chain: its kind, what Temporal knows of it, its message."""
    name = type(err).__name__
    message = _one_line(getattr(err, "message", None) or str(err))
    if isinstance(err, ApplicationError):
        return f"{name} [{err.type or 'untyped'}]{' (non-retryable)' if err.non_retryable else ''}: {message}"
    if isinstance(err, ActivityError):
        return f"{name} (activity {err.activity_type}, {_enum_name(err.retry_state)}): {message}"
    if isinstance(err, ChildWorkflowError):
        return f"{name} ({err.workflow_type} {err.workflow_id}, {_enum_name(err.retry_state)}): {message}"
    if isinstance(err, TemporalTimeoutError):
        return f"{name} ({_enum_name(err.type)}): {message}"
    return f"{name}: {message}"


def _enum_name(value: Any) -> str:
    return value.name if value is not None else "UNSPECIFIED"


def failure_lines(err: BaseException) -> list[str]:
    """The failure and each of its causes, outermost first, one line each, no stacks."""
    lines: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen and len(lines) < 20:
        seen.add(id(e))
        lines.append(("caused by " if lines else "") + _failure_line(e))
        e = e.__cause__
    return lines


def run_failure_text(run: str, err: WorkflowFailureError) -> str:
    """What ``wait`` prints for a run that did not complete: a headline, then the cause chain."""
    cause = err.cause
    how = (
        "was terminated"
        if isinstance(cause, TerminatedError)
        else "was cancelled"
        if isinstance(cause, CancelledError)
        else "timed out"
        if isinstance(cause, TemporalTimeoutError)
        else "failed"
    )
    return "\n".join([f"run {run} {how}:", *(f"  {line}" for line in failure_lines(err))])


def progress_line(s: dict) -> str:
    """The progress line of ``wait``: step, mean reward of the last step, rollouts in flight, checkpoints."""
    rewards = s.get("rewardPerStep") or []
    reward = f"{rewards[-1]:.3f}" if rewards else "—"
    checkpoints = s.get("checkpoints") or []
    completed = sum(1 for c in checkpoints if c.get("outcome") == "completed")
    failed = sum(1 for c in checkpoints if c.get("outcome") == "failed")
    # The run keeps its last MAX_KEPT_OUTCOMES outcomes: past that the counts are of those.
    kept = f" of the last {MAX_KEPT_OUTCOMES}" if len(checkpoints) >= MAX_KEPT_OUTCOMES else ""
    return (
        f"step {s.get('steps')}  mean reward {reward}  in flight {s.get('inFlight')}  "
        f"checkpoints {completed}{f' (+{failed} failed)' if failed else ''}{kept}  [{s.get('phase')}]"
    )


async def _show_progress(handle: WorkflowHandle, run: str) -> None:
    """Redraws one status line on stderr (a terminal) every 1.5 s until cancelled."""
    out = sys.stderr
    last: dict | None = None
    problem: str | None = None
    try:
        while True:
            try:
                # A query waits for a worker: without one it would hang, and the line would never say so.
                last = await asyncio.wait_for(handle.query(STATUS_QUERY), 5.0)
                problem = None
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 (shown on the line, not fatal)
                problem = _one_line(str(err) or type(err).__name__)[:80]
            text = (progress_line(last) if last else f"waiting for run {run}") + (f"  (no status: {problem})" if problem else "")
            # A wrapped line cannot be redrawn with \r: cut it to the terminal's width.
            width = (os.get_terminal_size(out.fileno()).columns if out.isatty() else 0) or 80
            out.write(f"\r\x1b[2K{text[: max(20, width - 1)]}")
            out.flush()
            await asyncio.sleep(1.5)
    finally:
        out.write("\r\x1b[2K")
        out.flush()


async def wait_for_run(client: Client, run: str, progress: bool | None = None) -> Any:
    """Waits for the run to end and returns its summary; a failed run raises RunClientError with its cause chain.

    ``progress``: a status line on stderr meanwhile (default: when stderr is a terminal).
    """
    d = await describe_run(client, run)
    handle = client.get_workflow_handle(run)
    show = sys.stderr.isatty() if progress is None else progress
    task = asyncio.ensure_future(_show_progress(handle, run)) if show and d.status == WorkflowExecutionStatus.RUNNING else None
    try:
        return await handle.result()
    except WorkflowFailureError as err:
        raise RunClientError(run_failure_text(run, err)) from None
    finally:
        if task:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
