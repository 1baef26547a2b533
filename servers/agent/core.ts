// What every part of the agent shares: options, the sessions table, the admission gate, the
// in-flight restarts and (with checkpointing on) the control plane's retire marks.
import type { FastifyBaseLogger } from 'fastify';
import { captureKey, type EpisodeId } from '../../protocol/ids.js';
import { AdmissionGate } from '../common/async.js';
import type { ControlPlane } from '../control/control-plane.js';
import { InflightCalls } from './inflight.js';
import type { AgentOptions } from './options.js';
import { SessionTable, type AgentSession } from './sessions.js';

export type AgentMode = 'full' | 'restart_only';

export class AgentCore {
  readonly sessions: SessionTable;
  readonly gate = new AdmissionGate();
  readonly inflight: InflightCalls;
  readonly mode: AgentMode;
  /** Set once the control plane is mounted; undefined = checkpointing off. */
  plane: ControlPlane | undefined;
  /** Aborted when the server closes: waits for resume end, running activations stop. */
  readonly shutdown = new AbortController();

  constructor(
    readonly name: string,
    readonly options: AgentOptions,
    readonly modelUrl: string,
    readonly sessionSecret: string,
    readonly log: FastifyBaseLogger,
  ) {
    this.mode = options.checkpoint_sessions_supported ? 'full' : 'restart_only';
    this.sessions = new SessionTable(options.session_close_retry_window_seconds * 1000);
    this.inflight = new InflightCalls(() => this.notify());
  }

  get checkpointing(): boolean {
    return this.plane !== undefined;
  }

  /** Wakes a waiting prepare (readiness may have changed). */
  notify(): void {
    this.plane?.notify();
  }

  assertNotRetired(e: EpisodeId | null): void {
    if (e && this.plane) this.plane.assertNotRetired(e);
  }

  /** Restarts carried by the current prepare: this agent neither parks nor exports their sessions. */
  isCarriedRestart(s: AgentSession): boolean {
    return s.episode !== null && (this.plane?.carriedRestarts.has(captureKey(s.episode)) ?? false);
  }

  /**
   * A session parks at a boundary while a checkpoint is open (prepare until resume, or restore
   * until resume). One gate for all sessions: close_admission requests parking of every session
   * at once, and a session woken by a resume that a new prepare follows stays parked.
   */
  parkWanted(s: AgentSession): boolean {
    return this.mode === 'full' && this.checkpointing && !this.gate.isOpen && !this.isCarriedRestart(s);
  }

  /** Until admission is open again; a cancelled wait (retire, close, shutdown) ends with the signal's reason. */
  async waitForResume(signal: AbortSignal = this.shutdown.signal): Promise<void> {
    while (!this.gate.isOpen) await this.gate.wait(signal);
  }
}
