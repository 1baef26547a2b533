// `POST /v1/responses` (participants.md §3.3–3.4): an activation of a seeded session (with the
// session cookie), or a direct call without one (a restart when it carries a rollout prefix).
import { refuse } from '../../protocol/errors.js';
import { sameEpisode, type CaptureKey, type RolloutPath } from '../../protocol/ids.js';
import type { ChatTool } from '../../protocol/openai.js';
import { decideActivation, invocationId, parseActivationIndex } from './activation-index.js';
import { toChatMessages, toChatTools } from './chat-format.js';
import type { AgentCore } from './core.js';
import { cloneLoopState, freshLoopState, type LoopState } from './loop-state.js';
import { awaitingModel, recordBoundary } from './parking.js';
import { callModel, callTool } from './peers.js';
import { buildResponse, responseId, trajectoryOf, withActivation, withGap } from './reply.js';
import type { AgentSession, RunningActivation } from './sessions.js';
import { runTurnLoop, type TurnLoopDeps } from './turn-loop.js';
import type { ActivationBody, CompletedReply } from './wire.js';

export interface ActivationRequest {
  rollout: RolloutPath | undefined;
  /** The cookie's agent session ID; undefined without a session cookie (a direct call). */
  sessionKey: string | undefined;
  indexHeader: string | string[] | undefined;
  body: ActivationBody;
}

export async function handleActivation(core: AgentCore, req: ActivationRequest): Promise<CompletedReply> {
  const r = req.rollout;
  if (core.checkpointing) {
    // Before any replay, claim or activation (§3.4 step 1).
    if (!r) throw refuse('rollout_id_required', 'agent work needs a /ng-rollout/<capture key> prefix while checkpointing is on');
    if (!r.episode) throw refuse('invalid_rollout_id', `cannot decode the capture key '${r.key}'`);
    core.assertNotRetired(r.episode);
  }
  const tracked = core.checkpointing && r?.episode && (req.sessionKey === undefined || core.mode === 'restart_only');
  if (!tracked) return req.sessionKey === undefined ? directCall(core, req, undefined) : activateSession(core, req, undefined);
  // Restarts: tracked by capture key, never parked, cancelled by a retire.
  return core.inflight.run(r.key, r.episode!, (signal) => (req.sessionKey === undefined ? directCall(core, req, signal) : activateSession(core, req, signal)));
}

async function activateSession(core: AgentCore, req: ActivationRequest, requestSignal: AbortSignal | undefined): Promise<CompletedReply> {
  const key = req.sessionKey!;
  const s = core.sessions.get(key);
  if (!s) {
    if (core.sessions.receipt(key)) throw refuse('checkpoint_error', `agent session '${key}' is closed`);
    throw refuse('invalid_request', `unknown agent session '${key}'`);
  }
  const episode = req.rollout?.episode;
  if (core.checkpointing && s.episode && episode && !sameEpisode(s.episode, episode)) {
    throw refuse('stale_attempt', `agent session '${key}' belongs to attempt ${JSON.stringify(s.episode)}, not ${req.rollout!.key}`);
  }
  if (s.retiring) throw refuse('stale_attempt', `agent session '${key}' is being retired`);
  if (s.closing) throw refuse('checkpoint_error', `agent session '${key}' is being closed`);
  const index = core.checkpointing ? parseActivationIndex(req.indexHeader) : undefined;
  // Bad input is refused before the activation is counted.
  const tools = toChatTools(req.body.tools);
  toChatMessages(req.body.input, []);
  const decision = decideActivation(
    {
      activations: s.activations,
      completedActivation: s.completedActivation,
      hasCompletedReply: s.completedReply !== null,
      runningIndex: s.running?.index,
    },
    index,
  );
  switch (decision.kind) {
    case 'out_of_order':
      throw refuse('activation_out_of_order', `agent session '${key}': ${decision.detail}`);
    case 'busy':
      throw refuse('checkpoint_error', `agent session '${key}' is already running activation ${s.running?.index}`);
    case 'replay':
      // Same body, same cookies, nothing re-run; this also claims a restored session.
      s.restoredPending = false;
      return s.completedReply!;
    case 'wait':
      return s.running!.result;
    case 'run': {
      const running = startActivation(core, s, decision.index, index !== undefined, req, tools);
      requestSignal?.addEventListener('abort', () => cancelActivation(running, requestSignal.reason), { once: true });
      return running.result;
    }
  }
}

/** Cancels a running activation once (a close and a retire never cancel twice). */
export function cancelActivation(running: RunningActivation, reason: unknown): void {
  if (running.cancelled) return;
  running.cancelled = true;
  running.controller.abort(reason);
}

function startActivation(core: AgentCore, s: AgentSession, index: number, keepReply: boolean, req: ActivationRequest, tools: ChatTool[]): RunningActivation {
  // An activation continued from a restored boundary was counted before the crash: same index, same ID.
  const continuing = s.continuation !== null && index === s.activations;
  const id = invocationId(index);
  let start: LoopState;
  if (continuing) {
    start = cloneLoopState(s.continuation!);
    start.gaps.push({ kind: 'restored', invocation_id: id, step: start.step, attempt: s.episode?.attempt ?? null });
  } else {
    start = freshLoopState(s.resourcesCookies);
  }
  s.continuation = null;
  s.activations = index;
  s.restoredPending = false;
  s.state = 'running';
  const running: RunningActivation = {
    index,
    invocationId: id,
    controller: new AbortController(),
    cancelled: false,
    result: undefined as never,
    stopped: undefined as never,
  };
  s.running = running;
  running.result = runActivation(core, s, running, start, keepReply, req, tools);
  running.stopped = running.result.then(
    () => undefined,
    () => undefined,
  );
  core.notify();
  return running;
}

async function runActivation(
  core: AgentCore,
  s: AgentSession,
  running: RunningActivation,
  start: LoopState,
  keepReply: boolean,
  req: ActivationRequest,
  tools: ChatTool[],
): Promise<CompletedReply> {
  const signal = running.controller.signal;
  const rollout = req.rollout?.key;
  const deps: TurnLoopDeps = {
    input: req.body.input,
    maxSteps: core.options.max_steps,
    signal,
    boundary: (state) => recordBoundary(core, s, state, signal),
    callModel: (messages, state) =>
      awaitingModel(core, s, signal, () =>
        callModel({ modelUrl: core.modelUrl, rollout, messages, tools, params: req.body, cookies: state.model_server_cookies, step: state.step + 1, signal }),
      ),
    callTool: (call, state) => callTool({ grant: s.grant, rollout, call, cookies: state.resources_server_cookies, signal }),
  };
  try {
    const out = await runTurnLoop(start, deps);
    const response = buildResponse({
      id: responseId(s.key, running.index),
      state: out.state,
      incomplete: out.incomplete,
      trajectory: keepReply ? undefined : trajectoryOf(running.invocationId, out.state),
    });
    if (s.grant) s.resourcesCookies = out.state.resources_server_cookies;
    s.observations = withActivation(
      s.observations,
      {
        invocation_id: running.invocationId,
        activation: running.index,
        turns: out.state.turns,
        tool_records: out.state.tool_records,
        model_calls: out.state.model_calls,
      },
      out.state.gaps,
    );
    const reply: CompletedReply = { response, cookies: {} };
    s.completedActivation = s.activations;
    s.completedReply = keepReply ? reply : null;
    return reply;
  } catch (err) {
    if (signal.aborted) {
      s.observations = withGap(s.observations, {
        kind: 'cancelled',
        invocation_id: running.invocationId,
        activation: running.index,
        reason: reasonText(signal.reason),
      });
    }
    throw err;
  } finally {
    if (s.running === running) s.running = undefined;
    s.state = 'idle';
    s.boundary = null;
    core.notify();
  }
}

/** No session cookie: a stateless call with no tool access (a restart when prefixed). */
async function directCall(core: AgentCore, req: ActivationRequest, signal: AbortSignal | undefined): Promise<CompletedReply> {
  const sig = signal ?? new AbortController().signal;
  const rollout: CaptureKey | undefined = req.rollout?.key;
  const tools = toChatTools(req.body.tools);
  toChatMessages(req.body.input, []);
  const out = await runTurnLoop(freshLoopState(null), {
    input: req.body.input,
    maxSteps: core.options.max_steps,
    signal: sig,
    boundary: async () => sig.throwIfAborted(),
    callModel: (messages, state) =>
      callModel({
        modelUrl: core.modelUrl,
        rollout,
        messages,
        tools,
        params: req.body,
        cookies: state.model_server_cookies,
        step: state.step + 1,
        signal: sig,
      }),
    callTool: (call, state) => callTool({ grant: null, rollout, call, cookies: state.resources_server_cookies, signal: sig }),
  });
  const response = buildResponse({ id: responseId(undefined, 1), state: out.state, incomplete: out.incomplete, trajectory: trajectoryOf('root', out.state) });
  return { response, cookies: {} };
}

function reasonText(reason: unknown): string {
  if (reason && typeof reason === 'object' && 'detail' in reason) return String((reason as { detail: unknown }).detail);
  return reason instanceof Error ? reason.message : String(reason);
}
