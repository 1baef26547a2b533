// The step model every episode owner shares (participants.md §1.6): after each completed step the
// owner records a boundary; a step in flight runs in `wait` mode (a checkpoint waits for it) or
// `replay` mode (the checkpoint counts the episode at the boundary before it and re-runs the step
// after a crash). Tracks per-episode state, parks episodes at boundaries while a checkpoint is
// open, suspends their deadlines meanwhile, and keeps a running blocker count so readiness is O(1).
//
// Knows nothing about HTTP or the control plane: the owner calls `close()`/`open()` from its
// admission hooks and passes a `notify` that wakes a waiting prepare.
import { type JsonText, hasJsonText, jsonTextOnce } from '../../protocol/json-text.js';
import type { SteadyObjects } from '../control/ahead.js';
import type { PausableDeadline } from './pausable-deadline.js';

export type StepMode = 'wait' | 'replay';
export type EpisodeState = 'running' | 'wait_step' | 'replay_step' | 'parked';
/** A boundary: a JSON object naming the `next` step and what that step needs. */
export type Boundary = { [key: string]: unknown };
/** A boundary as recorded: eager, or a thunk evaluated only if a checkpoint exports it. */
export type BoundarySource = Boundary | (() => Boundary);

/** The episode was retired while it waited (parked, or waiting to become a restart). */
export class EpisodeCancelled extends Error {
  constructor(readonly key: string) {
    super(`episode ${key} was retired`);
    this.name = 'EpisodeCancelled';
  }
}

export interface BeginOptions {
  /** The restored boundary this episode continues from (it is also its current boundary, rule 8). */
  continuation?: Boundary | null;
  deadline?: PausableDeadline;
  /** Begun as a restart (an owner that records no boundaries). */
  restart?: boolean;
  /** Stops the episode's work (called by the first retire unless final cleanup started). */
  cancel?: () => void;
  /** Settles once the episode's work, final cleanup included, has ended (a retire waits for it). */
  done?: Promise<unknown>;
}

interface Episode {
  state: EpisodeState;
  boundary: BoundarySource | null;
  continuation: Boundary | null;
  restart: boolean;
  /** Being retired: blocks whatever its state, must not continue past a boundary. */
  retired: boolean;
  /** Final cleanup started: a retire waits for it without cancelling. */
  finishing: boolean;
  deadline: PausableDeadline | undefined;
  cancel: (() => void) | undefined;
  done: Promise<unknown> | undefined;
  /** Woken by resume (`open`) and by retire; each waiter re-checks its own condition. */
  waiters: Array<() => void>;
}

function blocks(e: Episode): boolean {
  return e.retired || (!e.restart && (e.state === 'running' || e.state === 'wait_step'));
}

/** Counted at a boundary by a checkpoint: exported with its latest boundary (rule 7). */
function exportable(e: Episode): boolean {
  return (e.state === 'parked' || e.state === 'replay_step') && !e.retired && !e.restart;
}

export class EpisodeSteps {
  private readonly episodes = new Map<string, Episode>();
  private blocking = 0;
  private isClosed = false;

  /** @param notify wakes a waiting prepare; called only while a checkpoint is open. */
  constructor(private readonly notify: () => void = () => undefined) {}

  get closed(): boolean {
    return this.isClosed;
  }

  /** Tracked episodes (live, including ones being retired). */
  get size(): number {
    return this.episodes.size;
  }

  /** Episodes a checkpoint must wait for: running, in a wait step, or being retired (restarts excluded). */
  get blockerCount(): number {
    return this.blocking;
  }

  has(key: string): boolean {
    return this.episodes.has(key);
  }

  keys(): string[] {
    return [...this.episodes.keys()];
  }

  stateOf(key: string): EpisodeState | undefined {
    return this.episodes.get(key)?.state;
  }

  isRestart(key: string): boolean {
    return this.episodes.get(key)?.restart ?? false;
  }

  isRetiring(key: string): boolean {
    return this.episodes.get(key)?.retired ?? false;
  }

  /** The latest stored boundary (thunks evaluated); undefined when not tracked. */
  boundaryOf(key: string): Boundary | null | undefined {
    const e = this.episodes.get(key);
    return e ? evaluate(e.boundary) : undefined;
  }

  // --- lifecycle ------------------------------------------------------------------------

  begin(key: string, opts: BeginOptions = {}): void {
    if (this.episodes.has(key)) throw new Error(`episode ${key} is already running`);
    const continuation = opts.continuation ?? null;
    const e: Episode = {
      state: 'running',
      // Rule 8: a restored episode is at its restored boundary until it records a new one.
      boundary: continuation,
      continuation,
      restart: opts.restart ?? false,
      retired: false,
      finishing: false,
      deadline: opts.deadline,
      cancel: opts.cancel,
      done: opts.done,
      waiters: [],
    };
    this.episodes.set(key, e);
    this.blocking += Number(blocks(e));
    this.changed();
  }

  /** The restored boundary this episode continues from, handed out once. */
  continuation(key: string): Boundary | null {
    const e = this.get(key);
    const c = e.continuation;
    e.continuation = null;
    return c;
  }

  /**
   * Rule 6: the episode becomes a restart from now on. Waits while a checkpoint is open, so the
   * restart set (and the exported set) cannot change during one.
   */
  async markRestart(key: string, signal?: AbortSignal): Promise<void> {
    for (;;) {
      const e = this.episodes.get(key);
      if (!e) return;
      if (e.retired) throw new EpisodeCancelled(key);
      if (!this.isClosed) {
        this.update(e, () => (e.restart = true));
        this.changed();
        return;
      }
      await this.wake(e, signal);
    }
  }

  /** The protocol is over and the owner is releasing what it created: a retire no longer cancels. */
  finishing(key: string): void {
    const e = this.episodes.get(key);
    if (e) e.finishing = true;
  }

  /** Untracks the episode (its owner's work is over). */
  end(key: string): void {
    const e = this.episodes.get(key);
    if (e) this.untrack(key, e);
    this.changed();
  }

  // --- boundaries and steps ---------------------------------------------------------------

  /**
   * Rule 1: records a completed step. With no checkpoint open (or for a restart) it just stores
   * the boundary; otherwise the episode parks here, its deadline suspended, until resume. A new
   * checkpoint that closes admission before it wakes keeps it parked; a retire ends the wait with
   * `EpisodeCancelled`.
   */
  async boundary(key: string, boundary: BoundarySource, signal?: AbortSignal): Promise<void> {
    const e = this.get(key);
    if (e.retired) throw new EpisodeCancelled(key);
    e.boundary = boundary;
    if (!this.isClosed || e.restart) {
      if (e.state !== 'running') this.update(e, () => (e.state = 'running'));
      return;
    }
    this.update(e, () => (e.state = 'parked'));
    e.deadline?.suspend();
    this.notify();
    for (;;) {
      await this.wake(e, signal);
      if (e.retired) throw new EpisodeCancelled(key);
      if (!this.isClosed) break;
    }
    if (this.episodes.get(key) === e) this.update(e, () => (e.state = 'running'));
  }

  /**
   * Runs one step in `mode`. Rule 2: a replay step that completes while a checkpoint is open stays
   * `replay_step` (counted at the boundary before it) until the next boundary parks it. Rule 3: one
   * that raises while a checkpoint is open clears the boundary (start over from input) and stays
   * out of the blockers; the owner holds its cleanup with `awaitRelease`. Rule 4: any other step
   * that raises goes back to `running` and blocks until the episode ends.
   */
  async step<T>(key: string, mode: StepMode, work: () => Promise<T>): Promise<T> {
    const e = this.get(key);
    this.update(e, () => (e.state = mode === 'wait' ? 'wait_step' : 'replay_step'));
    if (mode === 'replay' && this.isClosed) e.deadline?.suspend();
    this.changed();
    let completed = false;
    try {
      const result = await work();
      completed = true;
      return result;
    } finally {
      if (this.episodes.get(key) === e) {
        if (mode === 'replay' && this.isClosed) {
          // Its failure may close sessions the boundary before the step needs, so the checkpoint
          // exports it with no boundary; one failing episode does not fail the checkpoint.
          if (!completed) e.boundary = null;
        } else {
          this.update(e, () => (e.state = 'running'));
          e.deadline?.resume();
        }
      }
      this.changed();
    }
  }

  /**
   * Rule 3: an episode a checkpoint counts at a boundary must not clean up, end or reply before
   * the resume. Resolves at once otherwise, and when the episode is retired (its cleanup must run).
   */
  async awaitRelease(key: string, signal?: AbortSignal): Promise<void> {
    for (;;) {
      const e = this.episodes.get(key);
      if (!e || !this.isClosed || !exportable(e)) return;
      await this.wake(e, signal);
    }
  }

  // --- admission --------------------------------------------------------------------------

  /** A checkpoint closed admission: from now on boundaries park; deadlines of counted episodes stop. */
  close(): void {
    this.isClosed = true;
    for (const e of this.episodes.values()) {
      if (e.state === 'parked' || e.state === 'replay_step') e.deadline?.suspend();
    }
  }

  /** Resume: deadlines run again and parked episodes continue. */
  open(): void {
    this.isClosed = false;
    for (const e of this.episodes.values()) {
      e.deadline?.resume();
      wakeAll(e);
    }
  }

  // --- readiness and export ---------------------------------------------------------------

  /** Ready iff nothing blocks; O(1) unless restarts carried from other participants must be excused. */
  ready(carried: ReadonlySet<string> = new Set()): boolean {
    if (this.blocking === 0) return true;
    if (carried.size === 0) return false;
    for (const [k, e] of this.episodes) if (blocks(e) && !carried.has(k)) return false;
    return true;
  }

  /** Every blocking episode (sorted); empty without a scan when nothing blocks. */
  blockers(): string[] {
    if (this.blocking === 0) return [];
    const out: string[] = [];
    for (const [k, e] of this.episodes) if (blocks(e)) out.push(k);
    return out.sort();
  }

  /** Rule 6: restarts not being retired, sorted. */
  restarts(): string[] {
    const out: string[] = [];
    for (const [k, e] of this.episodes) if (e.restart && !e.retired) out.push(k);
    return out.sort();
  }

  /** Rule 7: the latest boundary of every parked or replay-step episode (not retired, not a restart). */
  exported(): Map<string, Boundary | null> {
    const out = new Map<string, Boundary | null>();
    for (const [k, e] of this.episodes) if (exportable(e)) out.set(k, evaluate(e.boundary));
    return out;
  }

  /**
   * Rule 7 as JSON text, for the commit's records. A recorded boundary never changes (a new one
   * replaces it), so its text is made once, by the first checkpoint that exports it: an episode
   * parked across several checkpoints (a long tool call, a long generation) is not serialized
   * again while admission is closed.
   */
  exportedTexts(): Map<string, JsonText | null> {
    const out = new Map<string, JsonText | null>();
    for (const [k, e] of this.episodes) {
      if (!exportable(e)) continue;
      out.set(k, e.boundary === null ? null : boundaryText(e.boundary));
    }
    return out;
  }

  /**
   * The texts `exportedTexts` would make, made ahead while no checkpoint is open (the plane's
   * `stageAhead`): for each exportable episode whose boundary has stood since an earlier scan
   * (`steady`), one episode per step.
   */
  *stageTexts(steady: SteadyObjects): Generator<void> {
    for (const e of this.episodes.values()) {
      const source = e.boundary;
      if (source === null || !exportable(e) || hasJsonText(source) || !steady.steady(source)) continue;
      try {
        boundaryText(source);
      } catch {
        // The export fails on the same boundary and says why.
      }
      yield;
    }
  }

  // --- retire -----------------------------------------------------------------------------

  /**
   * Stops the episode: marks it retired (a blocker from now on), wakes it, cancels its work the
   * first time unless final cleanup started, waits until its work has ended, then untracks it.
   * Cut short by `signal`, it rejects and leaves the episode tracked and blocking, so a retried
   * retire waits again without cancelling twice.
   */
  async retire(key: string, signal?: AbortSignal): Promise<void> {
    const e = this.episodes.get(key);
    if (!e) return;
    const first = !e.retired;
    this.update(e, () => (e.retired = true));
    wakeAll(e);
    this.changed();
    if (first && !e.finishing) e.cancel?.();
    if (e.done) await untilSettled(e.done, signal);
    this.untrack(key, e);
    this.changed();
  }

  // --- internals --------------------------------------------------------------------------

  private get(key: string): Episode {
    const e = this.episodes.get(key);
    if (!e) throw new Error(`episode ${key} is not tracked`);
    return e;
  }

  /** Applies a change to one episode and keeps the blocker count exact. */
  private update(e: Episode, change: () => void): void {
    const before = blocks(e);
    change();
    this.blocking += Number(blocks(e)) - Number(before);
  }

  private untrack(key: string, e: Episode): void {
    if (this.episodes.get(key) !== e) return;
    this.episodes.delete(key);
    this.blocking -= Number(blocks(e));
    wakeAll(e);
  }

  /** Only a prepare waits for readiness, and only while admission is closed. */
  private changed(): void {
    if (this.isClosed) this.notify();
  }

  private wake(e: Episode, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const onAbort = (): void => {
        e.waiters = e.waiters.filter((w) => w !== done);
        reject(signal!.reason);
      };
      const done = (): void => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      e.waiters.push(done);
    });
  }
}

function wakeAll(e: Episode): void {
  const w = e.waiters;
  e.waiters = [];
  for (const wake of w) wake();
}

function evaluate(b: BoundarySource | null): Boundary | null {
  return typeof b === 'function' ? b() : b;
}

/** A recorded boundary's JSON text, made once (a new boundary replaces it, never changes it). */
function boundaryText(source: BoundarySource): JsonText {
  return jsonTextOnce(source, () => JSON.stringify(evaluate(source)));
}

/** Waits for `p` to settle (its outcome is the owner's business); rejects only when `signal` aborts. */
function untilSettled(p: Promise<unknown>, signal?: AbortSignal): Promise<void> {
  const settled = p.then(
    () => undefined,
    () => undefined,
  );
  if (!signal) return settled;
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<void>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    void settled.then(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    });
  });
}
