// The seam where the checkpoint participant (participants.md §5.2: admission gate, tickets,
// held responses, the capture ledger written at response start) plugs into the proxy. Until it
// exists every call passes straight through the open gate.
import type { CaptureKey, EpisodeId } from '../../protocol/ids.js';

/** One generation call as the gate sees it. */
export interface GenerationCall {
  /** The `/ng-rollout/<key>` capture key; undefined for calls outside an episode (eval, judge). */
  key: CaptureKey | undefined;
  episode: EpisodeId | undefined;
  /** The routed path without the prefix, e.g. `/v1/chat/completions`. */
  route: string;
  body: Record<string, unknown>;
  /** Aborted when the caller goes away before the response is complete. */
  signal: AbortSignal;
}

export interface GenerationGate {
  /** Admission, before any byte goes to the backend: may wait (admission closed) or throw a refusal. */
  beforeForward(call: GenerationCall): void | Promise<void>;
  /** Response start (the first chunk carrying data, §5.2 step 4): may hold while admission is closed. */
  onFirstChunk(call: GenerationCall): void | Promise<void>;
  /** The call is over: delivered, failed or abandoned. Called exactly once per admitted call. */
  onEnd(call: GenerationCall): void;
}

/** No checkpoint participant: admit everything, hold nothing. */
export const OPEN_GATE: GenerationGate = {
  beforeForward() {},
  onFirstChunk() {},
  onEnd() {},
};
