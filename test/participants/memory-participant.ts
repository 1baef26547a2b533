// A test participant: the control plane's hooks over an in-memory episode table. Contract
// tests drive it through real HTTP (inject or a socket), and `memory-server.ts` runs it as its
// own process for coordination tests.
import type { FastifyInstance } from 'fastify';
import { refuse } from '../../protocol/errors.js';
import { captureKey, nextAttempt, parseCaptureKey, type CaptureKey, type EpisodeId, type Kind } from '../../protocol/ids.js';
import { AdmissionGate } from '../../servers/common/async.js';
import { ControlPlane } from '../../servers/control/control-plane.js';
import type { CheckpointRecord } from '../../protocol/manifest.js';
import type { ParticipantHooks } from '../../servers/control/hooks.js';
import { mountControlPlane } from '../../servers/control/plugin.js';
import { createGymApp, rolloutOf } from '../../servers/common/app.js';
import { setTimeout as sleep } from 'node:timers/promises';

export interface MemoryEpisode {
  episode: EpisodeId;
  /** At a committable boundary (parked), or mid-step (a blocker). */
  atBoundary: boolean;
  /** This participant cannot capture it. */
  restart: boolean;
  payload: unknown;
  /** Installed from a checkpoint and not yet claimed by its replacement's first request. */
  restored: boolean;
}

export interface MemoryFaults {
  closeAdmissionThrows?: boolean;
  exportThrows?: boolean;
  exportDelayMs?: number;
  installThrows?: boolean;
  installDelayMs?: number;
  retireDelayMs?: number;
  /** Episodes whose retire never completes (they stay tracked and blocking). */
  retireHangs?: boolean;
  liveAfterForgetCheck?: boolean;
}

export interface MemoryParticipant {
  plane: ControlPlane;
  gate: AdmissionGate;
  episodes: Map<CaptureKey, MemoryEpisode>;
  faults: MemoryFaults;
  exports: number;
  installs: number;
  retired: EpisodeId[];
  deletedRestored: CaptureKey[];
  upsert(key: CaptureKey, patch: Partial<Omit<MemoryEpisode, 'episode'>>): MemoryEpisode;
}

export function createMemoryParticipant(opts: { instance: string; kind: Kind; leaseGraceSeconds?: number; leaseRetryMs?: number }): MemoryParticipant {
  const episodes = new Map<CaptureKey, MemoryEpisode>();
  const gate = new AdmissionGate();
  const faults: MemoryFaults = {};
  const retiring = new Set<CaptureKey>();

  const live = (carried: ReadonlySet<CaptureKey>): MemoryEpisode[] => [...episodes.values()].filter((e) => !e.restart && !carried.has(captureKey(e.episode)));

  const hooks: ParticipantHooks = {
    kind: opts.kind,
    closeAdmission() {
      if (faults.closeAdmissionThrows) throw refuse('checkpoint_error', 'closing admission failed (fault)');
      gate.close();
    },
    openAdmission() {
      gate.reopen();
    },
    ready(carried) {
      return live(carried).every((e) => e.atBoundary) && retiring.size === 0;
    },
    report(carried) {
      const blockers = [
        ...live(carried)
          .filter((e) => !e.atBoundary)
          .map((e) => captureKey(e.episode)),
        ...retiring,
      ];
      const restarts = [...episodes.values()].filter((e) => e.restart).map((e) => captureKey(e.episode));
      return { blockers, counts: { episodes: episodes.size }, restarts };
    },
    async export(req) {
      p.exports += 1;
      if (faults.exportDelayMs) await sleep(faults.exportDelayMs);
      if (faults.exportThrows) throw new Error('export failed (fault)');
      const inScope = req.scope ? new Set(req.scope.map(captureKey)) : undefined;
      const records: CheckpointRecord[] = [];
      for (const e of episodes.values()) {
        const key = captureKey(e.episode);
        if (e.restart || req.carriedRestarts.has(key) || retiring.has(key)) continue;
        // Restored state not yet claimed is exported again under its replacement attempt.
        if (inScope && !inScope.has(key)) continue;
        records.push({ episode_id: e.episode, payload: e.payload });
      }
      return { records, replyExtras: { exported_by: opts.instance } };
    },
    async deleteRestored(scope) {
      const keep = new Set(scope.map(captureKey));
      for (const [k, e] of episodes) {
        if (e.restored && !keep.has(k)) {
          episodes.delete(k);
          p.deletedRestored.push(k);
        }
      }
    },
    assertRestorable() {
      if ([...episodes.values()].some((e) => !e.restored)) {
        throw refuse('checkpoint_error', 'this process holds live episodes; restore needs a fresh process');
      }
    },
    validateRecord(record) {
      if (!('payload' in record)) throw new Error('record has no payload');
    },
    async install(req) {
      p.installs += 1;
      if (faults.installDelayMs) await sleep(faults.installDelayMs);
      if (faults.installThrows) throw refuse('checkpoint_error', 'install failed (fault)');
      const installed: CaptureKey[] = [];
      for (const r of req.records) {
        const replacement = nextAttempt(r.episode_id);
        const key = captureKey(replacement);
        episodes.set(key, { episode: replacement, atBoundary: true, restart: false, payload: r.payload, restored: true });
        installed.push(key);
      }
      return installed;
    },
    async retire(targets, signal) {
      for (const t of targets) {
        for (const [k, e] of episodes) {
          if (e.episode.rollout_id === t.rollout_id && e.episode.attempt <= t.attempt) retiring.add(k);
        }
      }
      plane.notify();
      if (faults.retireHangs) {
        await new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true }));
      }
      if (faults.retireDelayMs) await sleep(faults.retireDelayMs);
      for (const t of targets) {
        for (const [k, e] of episodes) {
          if (e.episode.rollout_id === t.rollout_id && e.episode.attempt <= t.attempt) {
            episodes.delete(k);
            retiring.delete(k);
          }
        }
        p.retired.push(t);
      }
    },
    assertForgettable(rolloutIds) {
      const ids = new Set(rolloutIds);
      const stillLive = [...retiring].filter((k) => ids.has(parseCaptureKey(k)!.rollout_id));
      if (stillLive.length || faults.liveAfterForgetCheck) {
        throw refuse('retire_incomplete', `retired work still tracked: ${stillLive.join(', ') || '(fault)'}`);
      }
    },
    statusExtras() {
      return {
        restored_pending: [...episodes.values()]
          .filter((e) => e.restored)
          .map((e) => captureKey(e.episode))
          .sort(),
      };
    },
  };

  const plane = new ControlPlane({
    instance: opts.instance,
    hooks,
    leaseGraceSeconds: opts.leaseGraceSeconds,
    leaseRetryMs: opts.leaseRetryMs,
  });

  const p: MemoryParticipant = {
    plane,
    gate,
    episodes,
    faults,
    exports: 0,
    installs: 0,
    retired: [],
    deletedRestored: [],
    upsert(key, patch) {
      const episode = parseCaptureKey(key);
      if (!episode) throw new Error(`bad capture key ${key}`);
      const cur = episodes.get(key) ?? { episode, atBoundary: false, restart: false, payload: null, restored: false };
      const next = { ...cur, ...patch };
      episodes.set(key, next);
      plane.notify();
      return next;
    },
  };
  return p;
}

/** A Gym-like server around the memory participant, with a small data plane and test routes. */
export async function buildMemoryServer(opts: {
  instance: string;
  kind: Kind;
  token: string;
  leaseGraceSeconds?: number;
  leaseRetryMs?: number;
  logLevel?: string;
}): Promise<{ app: FastifyInstance; participant: MemoryParticipant }> {
  const participant = createMemoryParticipant(opts);
  const app = createGymApp({ name: opts.instance, kind: opts.kind, logLevel: opts.logLevel ?? 'silent' });

  // Data plane: a step of an episode. Retired attempts are refused; closed admission parks it.
  app.post('/step', async (req) => {
    const r = rolloutOf(req);
    if (!r) throw refuse('rollout_id_required', 'no /ng-rollout/<id> prefix');
    if (!r.episode) throw refuse('invalid_rollout_id', `cannot decode '${r.key}'`);
    participant.plane.assertNotRetired(r.episode);
    await participant.gate.wait();
    participant.plane.assertNotRetired(r.episode);
    const body = (req.body ?? {}) as { payload?: unknown; atBoundary?: boolean };
    const e = participant.upsert(r.key, { payload: body.payload ?? null, atBoundary: body.atBoundary ?? true, restored: false });
    return { key: r.key, payload: e.payload };
  });

  // Test control: shape the episode table and faults from another process.
  app.post('/_test/episodes', async (req) => {
    const body = req.body as { key: string; atBoundary?: boolean; restart?: boolean; payload?: unknown };
    const { key, ...patch } = body;
    participant.upsert(key, patch);
    return { ok: true };
  });
  app.get('/_test/episodes', async () => [...participant.episodes.values()].map((e) => ({ key: captureKey(e.episode), ...e })));
  app.post('/_test/faults', async (req) => {
    Object.assign(participant.faults, req.body as MemoryFaults);
    return { ok: true };
  });
  app.get('/_test/stats', async () => ({
    exports: participant.exports,
    installs: participant.installs,
    retired: participant.retired.map(captureKey),
    deletedRestored: participant.deletedRestored,
    phase: participant.plane.currentPhase,
    admissionOpen: participant.gate.isOpen,
  }));

  await mountControlPlane(app, { plane: participant.plane, token: opts.token });
  return { app, participant };
}
