// The `single_agent_turn` stage protocol (participants.md §2.4): seed → invoke_agent → close_agent →
// verify → return. Every stage starts by recording its boundary, so a replacement that continues a
// restored boundary parks before doing any work and never redoes a stage before it.
import { callJsonOk, joinPath, type JsonReply } from '../common/http-client.js';
import { captureKey, rolloutPath, type CaptureKey } from '../../protocol/ids.js';
import { RunResultSchema, type RunFailure, type RunRequest, type RunResult } from '../../protocol/tasks.js';
import type { StageBoundary, Stage } from './boundaries.js';
import type { CleanupHandle, CleanupStack } from './cleanup-stack.js';
import type { BoundarySource, StepMode } from './episode-steps.js';
import { describe, FAILURE_REASON_MAX, ProtocolViolation, stageFailure } from './failures.js';
import { mintHandles, snapshotHandles, type SessionHandles } from './handles.js';

export const VERIFY_HEADER = 'x-ng-checkpoint-verify';
export const RESTART_HEADER = 'x-ng-checkpoint-restart';
export const ACTIVATION_HEADER = 'x-ng-agent-activation';
/** One activation per agent session in this protocol (design.md "Decisions"). */
export const ACTIVATION_INDEX = '1';

/** Where the episode's peers are. */
export interface TurnPeers {
  agentUrl: string;
  resourcesUrl: string;
  /** Names the direct HTTP tool grant (`<resources server name>.direct_http`). */
  resourcesName: string;
}

/** The episode's hold on the step tracker and its cancellation, as the runner wires them. */
export interface EpisodeControl {
  readonly key: CaptureKey;
  /** Aborted by the episode deadline or a retire. */
  readonly signal: AbortSignal;
  boundary(b: BoundarySource): Promise<void>;
  step<T>(mode: StepMode, work: () => Promise<T>): Promise<T>;
  markRestart(): Promise<void>;
  /** Waits while a checkpoint counts this episode at a boundary (rule 3). */
  awaitRelease(): Promise<void>;
}

type Json = Record<string, unknown>;

interface CloseReply {
  agent_session_id: string;
  agent_observations?: unknown;
  resources_cookies?: Record<string, string> | null;
  partial_response?: unknown;
  [k: string]: unknown;
}

export class SingleAgentTurn {
  private readonly key: CaptureKey;
  private handles: SessionHandles;
  private response: Json | null = null;
  private observations: unknown = null;
  private closeReply: CloseReply | undefined;
  private closeError: string | undefined;
  private agentCleanup: CleanupHandle | undefined;
  private resourcesCleanup: CleanupHandle | undefined;

  constructor(
    private readonly peers: TurnPeers,
    private readonly req: RunRequest,
    private readonly ctl: EpisodeControl,
    private readonly cleanup: CleanupStack,
    private readonly continuation: StageBoundary | null,
  ) {
    this.key = captureKey(req.episode_id);
    // A restored replacement reuses the sessions (IDs and cookies) its first attempt created.
    this.handles = continuation ? snapshotHandles(continuation.handles) : mintHandles();
  }

  /** Runs the stages from the restored boundary (or from `seed`); throws on failure. */
  async run(): Promise<RunResult> {
    const c = this.continuation;
    let stage: Stage = c?.next ?? 'seed';
    if (c && 'response' in c) this.response = c.response as Json;
    if (c && 'observations' in c) this.observations = c.observations ?? null;

    // Registered before seeding, so a lost seed reply still gets its session closed.
    this.resourcesCleanup = this.cleanup.register('resources session', (signal) => this.closeResources(signal));
    // A continuation past seeding owns an agent session already.
    if (stage === 'invoke_agent' || stage === 'close_agent') this.registerAgentCleanup();

    if (stage === 'seed') {
      const handles = snapshotHandles(this.handles);
      await this.ctl.boundary({ next: 'seed', handles });
      // Seeds are idempotent for caller-assigned session IDs: a checkpoint need not wait for them.
      await this.ctl.step('replay', async () => {
        const seed = await this.seedResources();
        this.registerAgentCleanup();
        await this.seedAgent(seed);
      });
      stage = 'invoke_agent';
    }

    if (stage === 'invoke_agent') {
      const handles = snapshotHandles(this.handles);
      await this.ctl.boundary({ next: 'invoke_agent', handles });
      // The agent parks at its own boundaries and continues from them after a restore.
      try {
        this.response = await this.ctl.step('replay', () => this.invokeAgent());
      } catch (err) {
        if (!this.ctl.signal.aborted) {
          // A failed activation closes the agent session at once so the failure carries its
          // observations; with a checkpoint open the close waits for the resume (rule 3).
          await this.ctl.awaitRelease();
          await this.agentCleanup?.close(this.ctl.signal).catch(() => undefined);
        }
        throw err;
      }
      stage = 'close_agent';
    }

    if (stage === 'close_agent') {
      const handles = snapshotHandles(this.handles);
      const response = this.response;
      await this.ctl.boundary(() => ({ next: 'close_agent', handles, response }));
      // The close returns observations and the final resources cookies exactly once: a wait step.
      await this.ctl.step('wait', async () => {
        try {
          await this.agentCleanup!.close(this.ctl.signal);
        } catch (err) {
          throw stageFailure('cleanup', err, this.response);
        }
      });
      this.observations = this.closeReply?.agent_observations ?? null;
      stage = 'verify';
    }

    let result: RunResult;
    if (stage === 'verify') {
      const handles = snapshotHandles(this.handles);
      const { response, observations } = this;
      await this.ctl.boundary(() => ({ next: 'verify', handles, response, observations }));
      result = await this.ctl.step(this.handles.resources_verify, () => this.verify());
      stage = 'return';
    } else {
      result = (c as Extract<StageBoundary, { next: 'return' }>).result;
    }

    // Recorded so a restore never runs a state-changing verification twice.
    const handles = snapshotHandles(this.handles);
    const observations = this.observations;
    await this.ctl.boundary(() => ({ next: 'return', handles, result, observations }));

    // Final unwinding retries the resources close once without erasing the verdict.
    const resources = this.resourcesCleanup;
    this.cleanup.register('post-verification resources session', (signal) => resources.close(signal));
    return { ...result, ng_agent_observations: observations };
  }

  /** Agent evidence for a failure reply, read after final cleanup closed the agent session. */
  evidence(failure: RunFailure): RunFailure {
    const out: RunFailure = { ...failure };
    if (this.closeReply) out.ng_agent_observations = this.closeReply.agent_observations ?? null;
    out.partial_response = failure.partial_response ?? this.response ?? this.closeReply?.partial_response ?? null;
    if (this.closeError !== undefined) out.cleanup_error = this.closeError;
    return out;
  }

  // --- stage work -------------------------------------------------------------------------

  private async seedResources(): Promise<Json> {
    const { task } = this.req;
    try {
      const r = await callJsonOk<Json>(
        this.peers.resourcesUrl,
        '/seed_session',
        {
          resources_session_id: this.handles.resources_session_id,
          episode_id: this.req.episode_id,
          task_id: task.task_id,
          task_data: task.task_input.task_data,
        },
        { rollout: this.key, signal: this.ctl.signal, held: true },
      );
      this.handles.resources_cookies = r.cookies;
      this.handles.resources_verify = header(r, VERIFY_HEADER) === 'replay' ? 'replay' : 'wait';
      if (header(r, RESTART_HEADER) === '1') await this.ctl.markRestart();
      if (Object.keys(r.cookies).length === 0) throw new ProtocolViolation('Resources seed did not establish a session cookie');
      const body = asObject(r.body, 'Resources seed reply');
      if (body.resources_session_id !== this.handles.resources_session_id) {
        throw new ProtocolViolation('Resources seed returned a different resources_session_id');
      }
      return body;
    } catch (err) {
      throw stageFailure('seed', err);
    }
  }

  private async seedAgent(seed: Json): Promise<void> {
    const { task } = this.req;
    const grant = {
      kind: 'direct_http',
      name: `${this.peers.resourcesName}.direct_http`,
      required: true,
      // Tool calls carry the seeding attempt, so the resources server attributes them.
      base_url: joinPath(this.peers.resourcesUrl, rolloutPath(this.key, '/')).replace(/\/+$/, ''),
      cookies: { ...this.handles.resources_cookies },
      headers: {},
    };
    try {
      const r = await callJsonOk<Json>(
        this.peers.agentUrl,
        '/v1/agent_sessions',
        {
          agent_session_id: this.handles.agent_session_id,
          episode_id: this.req.episode_id,
          task_id: task.task_id,
          tool_accesses: [grant],
          sandbox_access: seed.sandbox_access ?? null,
        },
        { rollout: this.key, signal: this.ctl.signal, held: true },
      );
      const body = asObject(r.body, 'Agent seed reply');
      if (body.agent_session_id !== this.handles.agent_session_id) {
        throw new ProtocolViolation('Agent seed returned a different agent_session_id');
      }
      this.handles.agent_cookies = r.cookies;
      if (header(r, RESTART_HEADER) === '1') await this.ctl.markRestart();
    } catch (err) {
      throw stageFailure('agent', err);
    }
  }

  private async invokeAgent(): Promise<Json> {
    try {
      const r = await callJsonOk<Json>(this.peers.agentUrl, '/v1/responses', this.req.task.task_input.responses_create_params, {
        rollout: this.key,
        cookies: this.handles.agent_cookies,
        headers: { [ACTIVATION_HEADER]: ACTIVATION_INDEX },
        signal: this.ctl.signal,
        held: true,
      });
      if (Object.keys(r.cookies).length) this.handles.agent_cookies = r.cookies;
      return asObject(r.body, 'Agent activation reply');
    } catch (err) {
      throw stageFailure('agent', err);
    }
  }

  private async verify(): Promise<RunResult> {
    const input = this.req.task.task_input;
    try {
      const r = await callJsonOk<Json>(
        this.peers.resourcesUrl,
        '/verify',
        // The resources server's flat verify body; the session cookie names the episode.
        { ...input.task_data, responses_create_params: input.responses_create_params, response: this.response },
        { rollout: this.key, cookies: this.handles.resources_cookies, signal: this.ctl.signal },
      );
      const parsed = RunResultSchema.safeParse(r.body);
      if (!parsed.success) throw new ProtocolViolation(`Verify reply is not a verification result: ${parsed.error.issues[0]?.message ?? 'invalid'}`);
      return {
        ...parsed.data,
        mask_sample: parsed.data.mask_sample ?? false,
        ng_trajectory: parsed.data.ng_trajectory ?? null,
        agent_timed_out: false,
        agent_timeout_seconds: input.agent_timeout_seconds,
      };
    } catch (err) {
      throw stageFailure('verification', err, this.response);
    }
  }

  // --- cleanups ---------------------------------------------------------------------------

  private registerAgentCleanup(): void {
    this.agentCleanup ??= this.cleanup.register('agent session', (signal) => this.closeAgent(signal));
  }

  private async closeAgent(signal: AbortSignal): Promise<void> {
    try {
      const r = await callJsonOk<CloseReply>(
        this.peers.agentUrl,
        '/v1/agent_sessions/close',
        { agent_session_id: this.handles.agent_session_id, episode_id: this.req.episode_id },
        { rollout: this.key, cookies: this.handles.agent_cookies, signal },
      );
      const body = asObject(r.body, 'Agent close reply') as CloseReply;
      if (body.agent_session_id !== this.handles.agent_session_id) {
        throw new ProtocolViolation('Agent close returned a different agent_session_id');
      }
      this.closeReply = body;
      // Null when the session had no direct HTTP grant: keep our own resources cookie.
      if (body.resources_cookies) this.handles.resources_cookies = { ...body.resources_cookies };
      this.closeError = undefined;
    } catch (err) {
      this.closeError = `${err instanceof Error ? err.name : 'Error'}: ${describe(err)}`.slice(0, FAILURE_REASON_MAX);
      throw err;
    }
  }

  private async closeResources(signal: AbortSignal): Promise<void> {
    await callJsonOk(
      this.peers.resourcesUrl,
      '/close_session',
      { resources_session_id: this.handles.resources_session_id, episode_id: this.req.episode_id },
      { rollout: this.key, cookies: this.handles.resources_cookies, signal },
    );
  }
}

function header(r: JsonReply, name: string): string | undefined {
  const v = r.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

function asObject(v: unknown, what: string): Json {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new ProtocolViolation(`${what} is not a JSON object`);
  return v as Json;
}
