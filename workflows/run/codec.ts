// The run state as continue-as-new carries it. The input is a single payload, limited to 2 MiB (a
// larger one fails the workflow task on every retry: the run would replay its whole history
// forever without progress). Plain JSON costs ~530 bytes per rollout in flight (over the limit at
// ~4,000); packed, with the in-flight entries reduced to what the ledger and IDs do not already
// say, ~130 bytes.
import { captureKey, type CaptureKey, type EpisodeId } from '../../protocol/episode-id.js';
import { packJson, unpackJson, type PackedJson } from '../../protocol/packed-json.js';
import * as L from '../ledger.js';
import { rolloutWorkflowId } from '../rolloutAttempt.js';
import type { InFlight, RunState } from './state.js';

/** Continue-as-new input above this (bytes of JSON) is not sent: the run keeps its history instead. */
export const MAX_CARRIED_STATE_BYTES = 1_500_000;

/** The compact form of `RunState.inFlight`: one row per attempt, derivable fields left out. */
type PackedInFlight = Array<
  | [rolloutId: string, attempt: number, environment: string, stopSignalled: boolean]
  | [rolloutId: string, attempt: number, environment: string, stopSignalled: boolean, key: string, groupId: string, workflowId: string]
>;

export function packRunState(st: RunState, run: string): PackedJson {
  const inFlight: PackedInFlight = Object.entries(st.inFlight).map(([key, f]) => {
    const e = f.episode;
    const derived = captureKey(e) === key && f.groupId === L.groupIdOfRollout(e.rollout_id) && f.workflowId === rolloutWorkflowId(run, e);
    return derived
      ? [e.rollout_id, e.attempt, f.environment, f.stopSignalled]
      : [e.rollout_id, e.attempt, f.environment, f.stopSignalled, key, f.groupId, f.workflowId];
  });
  return packJson({ ...st, inFlight });
}

export function unpackRunState(p: PackedJson, run: string): RunState {
  const raw = unpackJson<Omit<RunState, 'inFlight'> & { inFlight: PackedInFlight }>(p);
  const inFlight: Record<CaptureKey, InFlight> = {};
  for (const row of raw.inFlight) {
    const [rollout_id, attempt, environment, stopSignalled] = row;
    const episode: EpisodeId = { rollout_id, attempt };
    const key = row.length === 7 ? row[4] : captureKey(episode);
    inFlight[key] = {
      episode,
      groupId: row.length === 7 ? row[5] : L.groupIdOfRollout(rollout_id),
      environment,
      workflowId: row.length === 7 ? row[6] : rolloutWorkflowId(run, episode),
      stopSignalled,
    };
  }
  return { ...raw, inFlight };
}
