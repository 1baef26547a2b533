// The agent as a full checkpoint participant (participants.md §3.5–3.7): what the control plane
// asks of kind `agent` when `checkpoint_sessions_supported` is true.
import { refuse } from '../../protocol/errors.js';
import { captureKey, sortedKeys, type CaptureKey } from '../../protocol/ids.js';
import { hasJsonText } from '../../protocol/json-text.js';
import { SteadyObjects } from '../control/ahead.js';
import { builtOnWrite, type ParticipantHooks } from '../control/hooks.js';
import type { AgentCore } from './core.js';
import type { BoundarySnapshot } from './loop-state.js';
import { parseRecord, recordTexts, restoredSession, sessionRecord } from './records.js';
import { retireEpisodes } from './retire.js';
import { sessionCaptureKey, type AgentSession } from './sessions.js';

function blocks(s: AgentSession, carried: ReadonlySet<CaptureKey>): boolean {
  if (s.retiring || s.closing) return true;
  if (s.state !== 'running') return false;
  const key = sessionCaptureKey(s);
  return key === undefined || !carried.has(key);
}

export function fullParticipantHooks(core: AgentCore): ParticipantHooks {
  const assertRestorable = (): void => {
    const live = [...core.sessions.values()].filter((s) => !s.restoredPending).length;
    if (live > 0 || core.inflight.size > 0) {
      throw refuse('checkpoint_error', `agent '${core.name}' holds ${live} live sessions and ${core.inflight.size} calls; restore needs a fresh process`);
    }
  };
  const steady = new SteadyObjects();
  return {
    kind: 'agent',
    closeAdmission() {
      // Every session gets park_requested: it parks at its next boundary (see AgentCore.parkWanted).
      core.gate.close();
    },
    openAdmission() {
      core.gate.reopen();
      core.notify();
    },
    ready(carried) {
      // Seeds register without awaiting, so none is ever in progress here.
      for (const s of core.sessions.values()) if (blocks(s, carried)) return false;
      return true;
    },
    report(carried) {
      const blockers: string[] = [];
      let atBoundary = 0;
      for (const s of core.sessions.values()) {
        if (s.state === 'at_boundary') atBoundary += 1;
        if (blocks(s, carried)) blockers.push(sessionCaptureKey(s) ?? `session:${s.key}`);
      }
      return { blockers, counts: { sessions: core.sessions.size, at_boundary: atBoundary }, restarts: core.inflight.keys() };
    },
    async export(req) {
      const scope = req.scope ? new Set(req.scope.map(captureKey)) : null;
      const exported: [AgentSession, BoundarySnapshot | null][] = [];
      for (const s of core.sessions.values()) {
        req.signal.throwIfAborted();
        const key = sessionCaptureKey(s);
        if (key === undefined || s.retiring || req.carriedRestarts.has(key)) continue;
        if (scope && !scope.has(key)) continue;
        exported.push([s, s.boundary]);
      }
      return { records: builtOnWrite(exported, ([s, boundary]) => sessionRecord(s, boundary)) };
    },
    *stageAhead() {
      // A session at a boundary (a model call in flight) or waiting at a restored one: its record's
      // texts, exactly as the export makes them. A running session is about to record another.
      for (const s of core.sessions.values()) {
        const pinned = s.boundary;
        if (pinned === null || s.state === 'running' || s.retiring || s.closing || sessionCaptureKey(s) === undefined) continue;
        if (hasJsonText(pinned) || !steady.steady(pinned)) continue;
        try {
          recordTexts(s, pinned);
        } catch {
          // The export fails on the same record and says why.
        }
        yield;
      }
    },
    async deleteRestored(scope) {
      const keep = new Set(scope.map(captureKey));
      for (const s of [...core.sessions.values()]) {
        // Without a retire mark: the controller may still start the rollout over as that attempt.
        if (s.restoredPending && !keep.has(sessionCaptureKey(s) ?? '')) core.sessions.remove(s);
      }
      core.notify();
    },
    assertRestorable,
    validateRecord(record) {
      parseRecord(record);
    },
    async install(req) {
      // All or nothing: every record is checked before any session is registered.
      const sessions = req.records.map((r) => restoredSession(parseRecord(r)));
      const keys = new Set<string>();
      for (const s of sessions) {
        if (keys.has(s.key)) throw refuse('checkpoint_error', `agent session '${s.key}' appears twice in the checkpoint`);
        keys.add(s.key);
      }
      assertRestorable();
      for (const s of [...core.sessions.values()]) core.sessions.remove(s);
      for (const s of sessions) core.sessions.addRestored(s);
      core.notify();
      return sortedKeys(sessions.map((s) => sessionCaptureKey(s)!));
    },
    retire(episodes, signal) {
      return retireEpisodes(core, episodes, signal);
    },
    statusExtras() {
      const pending = [...core.sessions.values()].filter((s) => s.restoredPending).map((s) => sessionCaptureKey(s)!);
      return { accepting: core.gate.isOpen, restored_pending: sortedKeys(pending), capabilities: { supports_continuations: true } };
    },
  };
}
