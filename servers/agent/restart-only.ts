// The agent as a restart-only participant (participants.md §3.8), for
// `checkpoint_sessions_supported: false`: every call is tracked by capture key and reported as a
// restart, work keeps running through checkpoints, nothing is exported.
import { refuse } from '../../protocol/errors.js';
import { sortedKeys } from '../../protocol/ids.js';
import type { ParticipantHooks } from '../control/hooks.js';
import type { AgentCore } from './core.js';
import { retireEpisodes } from './retire.js';

/** Seed replies of a restart-only agent carry this header (§1.4). */
export const RESTART_HEADER = 'x-ng-checkpoint-restart';

export function restartOnlyHooks(core: AgentCore): ParticipantHooks {
  return {
    kind: 'agent',
    closeAdmission() {
      // Only new seeds wait; activations and closes keep running.
      core.gate.close();
    },
    openAdmission() {
      core.gate.reopen();
    },
    ready() {
      return true;
    },
    report() {
      return { blockers: [], counts: { inflight: core.inflight.size }, restarts: sortedKeys(core.inflight.keys()) };
    },
    async export() {
      return { records: [] };
    },
    assertRestorable() {
      if (core.sessions.size > 0 || core.inflight.size > 0) {
        throw refuse('checkpoint_error', `agent '${core.name}' holds live sessions or calls; restore needs a fresh process`);
      }
    },
    async install(req) {
      if (req.records.length > 0) {
        throw refuse(
          'checkpoint_error',
          `agent '${core.name}' is restart-only (checkpoint_sessions_supported: false) and cannot restore ${req.records.length} records`,
        );
      }
      return [];
    },
    retire(episodes, signal) {
      return retireEpisodes(core, episodes, signal);
    },
    statusExtras() {
      return { accepting: core.gate.isOpen, capabilities: { supports_continuations: false } };
    },
  };
}
