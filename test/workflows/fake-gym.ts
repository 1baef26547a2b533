// Fake activities for the controller's time-skipping workflow tests: a scriptable Gym and
// snapshot store in memory. They throw the REAL error types the real activities throw
// (ApplicationFailure typed by the protocol code, `gym_transient` for transport errors), so the
// workflows' classification is what gets tested.
import { createHash } from 'node:crypto';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import type { Activities } from '../../activities/index.js';
import { createAttemptStartActivities } from '../../activities/attempt-starts.js';
import { createShardSignalActivities } from '../../activities/shard-signals.js';
import { writeBatchPart, writeLedgerPart } from '../../activities/controller-files.js';
import { deliverReport } from '../../activities/rollouts.js';
import { isPackedJson, unpackJson } from '../../protocol/packed-json.js';
import type {
  CheckpointOutcome,
  GymCommitOutcome,
  GymPrepareOutcome,
  GymTopology,
  RolloutReport,
  RunEpisodeInput,
  SnapshotLocation,
} from '../../protocol/controller.js';
import { captureKey } from '../../protocol/ids.js';

export type Failure = 'transient' | 'refusal' | 'invariant';

export interface FakeGymScript {
  /** Prepare replies not ready this many times (then ready). */
  notReady?: number;
  /** Prepare throws this many times: Gym's prepare-past-deadline refusal (`deadline_exceeded`). */
  prepareDeadlineExceeded?: number;
  /** Commit throws this many times (per attempt of the activity). */
  commitFailures?: number;
  commitFailure?: Failure;
  /** Resume throws this many times. */
  resumeFailures?: number;
  /** Commit answers with participants that differ from the topology: the activity's invariant_error. */
  commitWrongParticipants?: boolean;
  /** Held prepares wait for `releasePrepare()` (heartbeating, like the real Gym calls). */
  holdPrepare?: boolean;
  /** `/run` replies wait for `finishRun(key)` (or `finishAll`); else they finish after `runMs`. */
  holdRuns?: boolean;
  runMs?: number;
  /**
   * Commit finds this many scope episodes already finished (not committed): their `/run`s reply
   * once the commit is done, after the run's early ledger cut.
   */
  finishedBeforeCommit?: number;
  /** Forget answers after this long (what it forgot is counted only then). */
  forgetDelayMs?: number;
  /** `/run` never heartbeats: a cancellation cannot reach it (only a retire ends it). */
  silentRuns?: boolean;
  reward?: (key: string) => number;
}

const TOPOLOGY: GymTopology = {
  members: [
    { name: 'env', url: 'http://127.0.0.1:1', kind: 'environment' },
    { name: 'agent', url: 'http://127.0.0.1:2', kind: 'agent' },
  ],
  servers: { counter_env: { kind: 'environment', url: 'http://127.0.0.1:1' }, weather_env: { kind: 'environment', url: 'http://127.0.0.1:1' } },
  fingerprint: 'f'.repeat(64),
  instances: { env: 'env-1', agent: 'agent-1' },
  environments: {
    counter_env: {
      environment: 'counter_env',
      agent: 'agent',
      supports_continuations: true,
      resources_checkpoint_mode: 'exported',
      verify_replayable: true,
      group_size: null,
    },
    weather_env: {
      environment: 'weather_env',
      agent: 'agent',
      supports_continuations: true,
      resources_checkpoint_mode: 'stateless',
      verify_replayable: true,
      group_size: null,
    },
  },
};

/** What a Gym call fails with while Gym is down: connection refused everywhere (as activities/gym.ts renders it). */
function unreachable(operation: string): ApplicationFailure {
  const failures = Object.fromEntries(TOPOLOGY.members.map((m) => [m.name, `transport error: connect ECONNREFUSED ${m.url}`]));
  return ApplicationFailure.retryable(`${operation} failed on ${TOPOLOGY.members.length} server(s): ECONNREFUSED`, 'gym_transient', {
    operation,
    failures,
    unreachable: TOPOLOGY.members.map((m) => m.name).sort(),
    refused: TOPOLOGY.members.map((m) => m.name).sort(),
  });
}

export class FakeGym {
  script: FakeGymScript = {};
  /** The next discoveries fail this many times as a Gym too busy to answer (a timeout: nothing refused). */
  busyLooks = 0;
  /** Gym's processes are down (crash() … comeBack()): every Gym call fails as unreachable. */
  down = false;
  /** Bumped by each crash: the instance identity the topology reports. */
  generation = 1;
  /** `/run`s in flight when Gym crashed: refused as `instance_mismatch` once it comes back. */
  private orphaned = new Map<string, () => void>();
  /** `/run`s a crash spared (their environment survived). */
  private spared = new Set<string>();
  /** Every activity call, in order (`prepare:<id>`, `commit:<id>`, `resume:<id>`, `run:<key>`, …). */
  calls: string[] = [];
  running = new Set<string>();
  private prepareGate: (() => void) | undefined;
  private runWaiters = new Map<string, (reward: number | { failure: string }) => void>();
  private runRetirers = new Map<string, () => void>();
  metrics: CheckpointOutcome[] = [];
  ledgerCuts: unknown[] = [];
  /** The digest each ledger cut returned, in order (what a manifest names). */
  ledgerCutDigests: string[] = [];
  /** The manifests `finalizeSnapshot` published. */
  published: Array<{ ledger_sha256: string; checkpoint_id: string }> = [];
  private discarded = new Set<string>();
  /** The shards' candidates by temp snapshot, the scope each commit sent, restore scope parts and answers, batch parts. */
  private candidates = new Map<string, Map<number, string[]>>();
  private lastCommitScope = new Map<string, string[]>();
  private scopeParts = new Map<string, Map<number, Array<{ rollout_id: string; attempt: number }>>>();
  private restoredIn = new Map<string, Record<string, string[]>>();
  batchParts = new Map<string, unknown>();

  /** The commit's scope: given, or the shards' candidates less the restarts. */
  private scopeOf(input: { checkpointDir: string; scope: Array<{ rollout_id: string; attempt: number }> | { shards: number; restarts: string[] } }): string[] {
    if (Array.isArray(input.scope)) return input.scope.map(captureKey);
    const restarts = new Set(input.scope.restarts);
    return [...(this.candidates.get(input.checkpointDir)?.values() ?? [])].flat().filter((k) => !restarts.has(k));
  }

  /**
   * Every Gym process dies: calls fail as unreachable; the `/run`s in flight hang until Gym comes
   * back. `spare`: `/run`s whose environment survived (a crash of other servers): they go on.
   */
  crash(spare: readonly string[] = []): void {
    this.down = true;
    this.generation += 1;
    for (const k of spare) this.spared.add(k);
    this.calls.push('crash');
  }

  /** Fresh processes answer (new instances): the `/run`s of attempts from before the crash are refused. */
  comeBack(): void {
    this.down = false;
    this.calls.push('come-back');
    for (const refuse of this.orphaned.values()) refuse();
    this.orphaned.clear();
  }

  releasePrepare(): void {
    this.prepareGate?.();
    this.prepareGate = undefined;
    this.script.holdPrepare = false;
  }

  finishRun(key: string, reward = 1): boolean {
    const w = this.runWaiters.get(key);
    if (!w) return false;
    w(reward);
    return true;
  }

  /** The `/run` of `key` replies with a failure (the episode failed; not terminal). */
  failRun(key: string, failure = 'tool call failed'): boolean {
    const w = this.runWaiters.get(key);
    if (!w) return false;
    w({ failure });
    return true;
  }

  finishAll(): number {
    const keys = [...this.runWaiters.keys()];
    for (const k of keys) this.finishRun(k);
    return keys.length;
  }

  count(prefix: string): number {
    return this.calls.filter((c) => c.startsWith(prefix)).length;
  }

  /** Capture keys of the `/run`s that ended cancelled or retired. */
  endedRuns(): Set<string> {
    return new Set(this.calls.filter((c) => c.startsWith('cancelled:') || c.startsWith('retired-run:')).map((c) => c.slice(c.indexOf(':') + 1)));
  }

  /** Capture keys of every `/run` call, in call order. */
  runKeys(): string[] {
    return this.calls.filter((c) => c.startsWith('run:')).map((c) => c.slice('run:'.length));
  }

  /** Calls other than `/run` and discovery (the checkpoint protocol and snapshot I/O). */
  controlCalls(): string[] {
    return this.calls.filter(
      (c) =>
        !c.startsWith('run:') &&
        !c.startsWith('cancelled:') &&
        !c.startsWith('retired-run:') &&
        c !== 'discover' &&
        !c.startsWith('forget:') &&
        c !== 'ledger-cut-refused',
    );
  }

  activities(): Partial<Activities> {
    const fail = (kind: Failure, what: string): never => {
      if (kind === 'transient') throw ApplicationFailure.retryable(`${what}: HTTP 500`, 'gym_transient');
      if (kind === 'refusal') throw ApplicationFailure.nonRetryable(`${what}: refused`, 'export_failed');
      throw ApplicationFailure.nonRetryable(`${what}: invariant`, 'invariant_error');
    };
    const s = this.script;
    const acts: Partial<Activities> = {
      discoverGym: async () => {
        this.calls.push('discover');
        if (this.down) throw unreachable('discover');
        if (this.busyLooks > 0) {
          this.busyLooks -= 1;
          throw ApplicationFailure.retryable('discover failed on 1 server(s): env: timeout after 10000 ms', 'gym_transient', {
            operation: 'discover',
            failures: { env: 'timeout after 10000 ms' },
          });
        }
        const g = this.generation;
        return g === 1 ? TOPOLOGY : { ...TOPOLOGY, instances: { env: `env-${g}`, agent: `agent-${g}` } };
      },
      loadPromptGroups: async (input) => {
        const groups = Array.from({ length: input.groups }, (_, i) => {
          const index = input.cursor + i;
          const taskset = input.tasksets?.[index % input.tasksets.length] ?? 'counter';
          return {
            group_id: `p${index}`,
            prompt_id: `prompt-${index}`,
            taskset,
            prompt_index: index,
            size: input.groupSize,
            tasks: Array.from({ length: input.groupSize }, (_, g) => ({ prompt: index, g })),
          };
        });
        return { groups, cursor: input.cursor + input.groups } as never;
      },
      gymPrepare: async (input): Promise<GymPrepareOutcome> => {
        this.calls.push(`prepare:${input.checkpointId}`);
        if (this.down) throw unreachable('prepare');
        if (s.holdPrepare) {
          // The real Gym activities heartbeat while they wait (cancellation and the 2-minute
          // heartbeat timeout both go through heartbeats; time skipping needs them to land).
          const ctx = Context.current();
          const beat = setInterval(() => ctx.heartbeat(), 200);
          try {
            await new Promise<void>((resolve, reject) => {
              this.prepareGate = resolve;
              ctx.cancellationSignal.addEventListener('abort', () => reject(ctx.cancellationSignal.reason));
            });
          } finally {
            clearInterval(beat);
          }
          // Gym crashed while the prepare was held: the connections broke.
          if (this.down) throw unreachable('prepare');
        }
        if ((s.prepareDeadlineExceeded ?? 0) > 0) {
          s.prepareDeadlineExceeded! -= 1;
          // As activities/gym.ts renders a refusal: non-retryable, typed by its code.
          throw ApplicationFailure.nonRetryable('prepare: past the deadline', 'deadline_exceeded');
        }
        if ((s.notReady ?? 0) > 0) {
          s.notReady! -= 1;
          return { checkpointId: input.checkpointId, prepared: false, restarts: [], blockers: { env: ['r-busy'] }, seconds: 0.01 };
        }
        return { checkpointId: input.checkpointId, prepared: true, restarts: [], blockers: {}, seconds: 0.01 };
      },
      gymCommit: async (input): Promise<GymCommitOutcome> => {
        this.calls.push(`commit:${input.checkpointId}`);
        if (this.down) throw unreachable('commit');
        if ((s.commitFailures ?? 0) > 0) {
          s.commitFailures! -= 1;
          fail(s.commitFailure ?? 'transient', 'commit');
        }
        const scope = this.scopeOf(input);
        this.lastCommitScope.set(input.checkpointDir, scope);
        const finished = scope.sort().slice(0, s.finishedBeforeCommit ?? 0);
        const keys = scope.filter((k) => !finished.includes(k)).sort();
        if (finished.length > 0)
          setTimeout(() => {
            for (const k of finished) this.finishRun(k);
          }, 200);
        // The real activity checks the replies against the topology (activities/gym.ts) and fails as this does.
        if (s.commitWrongParticipants)
          throw ApplicationFailure.nonRetryable('commit does not match the topology or scope: stranger: replied but is not in the topology', 'invariant_error');
        const participants: GymCommitOutcome['participants'] = {};
        for (const m of TOPOLOGY.members) {
          participants[m.name] = {
            kind: m.kind,
            instance: m.name,
            manifest: { checkpoint_id: input.checkpointId },
            episode_count: keys.length,
          };
        }
        return { checkpointId: input.checkpointId, participants, scopeCount: scope.length, uncommitted: finished, seconds: 0.01 };
      },
      gymResume: async (input) => {
        this.calls.push(`resume:${input.checkpointId}`);
        if (this.down) throw unreachable('resume');
        if ((s.resumeFailures ?? 0) > 0) {
          s.resumeFailures! -= 1;
          fail('transient', 'resume');
        }
        return { checkpointId: input.checkpointId, idempotent: [], seconds: 0.01 };
      },
      gymRetire: async (input) => {
        this.calls.push(`retire:${input.episodes.map(captureKey).join(',')}`);
        if (this.down) throw unreachable('retire');
        // Like the environment: a retire cancels the episode's task, its `/run` ends `stale_attempt`.
        for (const key of input.episodes.map(captureKey)) this.runRetirers.get(key)?.();
        return { retired: {}, seconds: 0 };
      },
      gymRestore: async (input) => {
        this.calls.push(`restore:${input.restoreId}`);
        if (this.down) throw unreachable('restore');
        const episodes = Array.isArray(input.scope) ? input.scope : [...(this.scopeParts.get(input.scope.dir)?.values() ?? [])].flat();
        const replacements = episodes.map((e) => captureKey({ rollout_id: e.rollout_id, attempt: e.attempt + 1 }));
        const restored = Object.fromEntries(Object.keys(TOPOLOGY.servers).map((n) => [n, replacements]));
        if (Array.isArray(input.scope)) return { restoreId: input.restoreId, restored, seconds: 0.01 };
        this.restoredIn.set(input.scope.dir, restored);
        return { restoreId: input.restoreId, restored: {}, restoredCounts: {}, scopeCount: episodes.length, seconds: 0.01 };
      },
      gymForget: async (input) => {
        if (this.script.forgetDelayMs) await new Promise((r) => setTimeout(r, this.script.forgetDelayMs));
        this.calls.push(`forget:${input.rolloutIds.length}`);
        if (this.down) throw unreachable('forget');
        return { forgotten: {}, seconds: 0 };
      },
      runEpisode: async (input: RunEpisodeInput): Promise<RolloutReport> => {
        const key = captureKey(input.episode);
        this.calls.push(`run:${key}`);
        // Down: the connection is refused, and the activity retries (a transient failure).
        if (this.down) throw ApplicationFailure.retryable(`/run of ${key}: transport error: ECONNREFUSED`, 'gym_transient');
        this.running.add(key);
        const started = Date.now();
        const ctx = Context.current();
        try {
          const reward = await new Promise<number | { failure: string }>((resolve, reject) => {
            const beat = s.silentRuns ? undefined : setInterval(() => ctx.heartbeat(), 200);
            let stop = (): void => clearInterval(beat);
            this.runWaiters.set(key, (reward) => {
              stop();
              resolve(reward);
            });
            this.orphaned.delete(key);
            const generation = this.generation;
            const watch = setInterval(() => {
              // Gym crashed under this /run: it hangs until fresh processes refuse it.
              if (this.generation !== generation && !this.orphaned.has(key) && !this.spared.has(key)) {
                this.orphaned.set(key, () => {
                  stop();
                  reject(ApplicationFailure.nonRetryable(`/run of ${key}: a fresh environment process does not know this attempt`, 'instance_mismatch'));
                });
              }
            }, 20);
            const stopBeat = stop;
            stop = (): void => {
              stopBeat();
              clearInterval(watch);
            };
            this.runRetirers.set(key, () => {
              stop();
              this.calls.push(`retired-run:${key}`);
              reject(ApplicationFailure.nonRetryable(`attempt ${key} was retired`, 'stale_attempt'));
            });
            if (!s.holdRuns)
              setTimeout(() => {
                stop();
                resolve(s.reward?.(key) ?? 1);
              }, s.runMs ?? 20);
            ctx.cancellationSignal.addEventListener('abort', () => {
              stop();
              reject(ctx.cancellationSignal.reason);
            });
          });
          const seconds = (Date.now() - started) / 1000;
          if (typeof reward !== 'number')
            return { captureKey: key, episode: input.episode, status: 'failed', reward: null, terminal: false, reason: reward.failure, result: null, seconds };
          const done: RolloutReport = { captureKey: key, episode: input.episode, status: 'completed', reward, terminal: false, result: { reward }, seconds };
          // As the controller's own `/run` activity: a completed report goes to its shard from here.
          return input.reportTo ? await deliverReport(ctx.client, input.reportTo, done) : done;
        } finally {
          this.runWaiters.delete(key);
          this.runRetirers.delete(key);
          this.running.delete(key);
          if (ctx.cancellationSignal.aborted) this.calls.push(`cancelled:${key}`);
        }
      },
      allocateSnapshot: async (input): Promise<SnapshotLocation> => {
        const seq = this.count('allocate') + 1;
        this.calls.push(`allocate:${seq}`);
        const root = `${input.checkpointDir}/${input.anchor}/rollout_snapshots`;
        const name = String(seq).padStart(6, '0');
        return { root, anchor: input.anchor, sequence: seq, tmpDir: `${root}/tmp_snapshot_${name}`, finalDir: `${root}/snapshot_${name}` };
      },
      writeCandidates: async (input) => {
        if (this.discarded.has(input.tmpDir)) throw ApplicationFailure.nonRetryable(`writeCandidates: ${input.tmpDir} does not exist`, 'invariant_error');
        const m = this.candidates.get(input.tmpDir) ?? new Map<number, string[]>();
        m.set(input.shard, input.episodes.map(captureKey));
        this.candidates.set(input.tmpDir, m);
        return { count: input.episodes.length };
      },
      writeLedgerPart: async (input) => {
        if (!input.create && this.discarded.has(input.dir)) {
          this.calls.push('ledger-cut-refused');
          throw ApplicationFailure.nonRetryable(`writeLedgerPart: ${input.dir} does not exist`, 'invariant_error');
        }
        this.calls.push(input.create ? 'ledger-part' : 'ledger-cut');
        // A trainer anchor's fallback parts go to disk: the trainer merges them into its marker.
        if (input.create) return writeLedgerPart(input);
        const ledger =
          input.ledger instanceof Uint8Array
            ? JSON.parse(Buffer.from(input.ledger).toString('utf8'))
            : isPackedJson(input.ledger)
              ? unpackJson(input.ledger)
              : input.ledger;
        if (!input.create) this.ledgerCuts.push(ledger);
        const text = JSON.stringify(ledger);
        const sha256 = createHash('sha256').update(text).digest('hex');
        if (!input.create) this.ledgerCutDigests.push(sha256);
        return { file: `controller/ledger-${input.shard}.json`, sha256, bytes: text.length };
      },
      scopeSlice: async (input) => this.lastCommitScope.get(input.snapshotDir.replace(/\/snapshot_(\d+)$/, '/tmp_snapshot_$1')) ?? [],
      writeScopePart: async (input) => {
        const m = this.scopeParts.get(input.dir) ?? new Map<number, Array<{ rollout_id: string; attempt: number }>>();
        m.set(
          input.shard,
          input.scope.map(([rollout_id, attempt]) => ({ rollout_id, attempt })),
        );
        this.scopeParts.set(input.dir, m);
        return { count: input.scope.length };
      },
      restoredSlice: async (input) => this.restoredIn.get(input.dir) ?? {},
      writeBatchPart: async (input) => {
        this.batchParts.set(input.file, input.batch);
        // On disk: a trainer reads its batch from the files.
        return writeBatchPart(input);
      },
      removeControllerDir: async () => undefined,
      writeSnapshotManifest: async () => {
        this.calls.push('manifest');
      },
      validateSnapshot: async () => {
        this.calls.push('validate');
        return {} as never;
      },
      publishSnapshot: async (input) => {
        this.calls.push(`publish:${input.location.sequence}`);
        return input.location.finalDir;
      },
      finalizeSnapshot: async (input) => {
        this.calls.push('manifest', 'validate', `publish:${input.location.sequence}`);
        this.published.push({ ledger_sha256: input.manifest.ledger_parts[0]?.sha256 ?? '', checkpoint_id: input.manifest.checkpoint_id });
        return input.location.finalDir;
      },
      snapshotPublishedBy: async (input) =>
        this.published.some((p) => p.checkpoint_id === input.checkpointId)
          ? { scopeCount: this.lastCommitScope.get(input.location.tmpDir)?.length ?? 0, restartCount: 0 }
          : null,
      applyRetention: async () => {
        this.calls.push('retention');
        return [];
      },
      discardSnapshot: async (input) => {
        this.discarded.add(input.tmpDir);
        this.calls.push('discard');
      },
      appendCheckpointMetrics: async (input) => {
        this.metrics.push(input.outcome);
      },
      // The controller's own: it starts the attempt workflows and signals the shards on the test server.
      ...createAttemptStartActivities(),
    };
    // A cut's files go to this fake too; the answers go through the test server.
    Object.assign(acts, createShardSignalActivities({ writeCandidates: acts.writeCandidates!, writeLedgerPart: acts.writeLedgerPart! }));
    return acts;
  }
}
