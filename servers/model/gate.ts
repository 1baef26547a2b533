// The seam between the proxy (proxy.ts: bytes to and from the backend) and the checkpoint
// participant (participant.ts: admission gate, tickets, held responses, the capture ledger written
// at response start; participants.md §5.2). Without a participant every call passes the open gate.
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

/** What is known when the response starts (its first data chunk). */
export interface ResponseStart {
  status: number;
  stream: boolean;
  /** A plain reply: the whole parsed JSON body (undefined when it is not JSON). */
  body?: unknown;
  /** A streamed reply: the complete events of the first data chunk, parsed. */
  events?: unknown[];
}

/** The assistant message of a reply (its text and tool calls), as the caller received it. */
export interface CompletionMessage {
  role: 'assistant';
  content: string | null;
  tool_calls?: Record<string, unknown>[];
}

/** The token ids and logprobs of a finished reply (for the token store). */
export interface ReplyTokens {
  responseId: string | null;
  weightVersion: number | null;
  promptTokenIds: number[] | null;
  completionTokenIds: number[] | null;
  completionLogprobs: number[] | null;
  /** Null (or absent) when the reply had no message (not a chat completion). */
  completionMessage?: CompletionMessage | null;
  finishReason: string | null;
  /** False when a stream ended before its `[DONE]`/finish reason. */
  complete: boolean;
}

/** An admitted call (a ticket): the proxy reports its response's progress here. */
export interface AdmittedCall {
  /** The body to send to the backend (the participant may add `ng_capture`). */
  readonly backendBody: Record<string, unknown>;
  /** Aborted when the participant cancels the call (retire); its reason is the refusal. */
  readonly signal: AbortSignal;
  /**
   * Response start (§5.2 step 4): holds while admission is closed, then marks the response
   * started and writes the ledger row. A throw poisons the call: nothing may be sent.
   */
  deliver(start: ResponseStart): Promise<void>;
  /** The reply was relayed completely (plain: at start; stream: at its end). */
  complete(tokens: ReplyTokens): Promise<void>;
  /** The call is over: delivered, failed or abandoned. Called exactly once. */
  end(): void;
}

export interface GenerationGate {
  /** Admission, before any byte goes to the backend: may wait (admission closed) or throw a refusal. */
  admit(call: GenerationCall): Promise<AdmittedCall>;
}

const NEVER = new AbortController().signal;

/** No checkpoint participant: admit everything, hold nothing, record nothing. */
export const OPEN_GATE: GenerationGate = {
  async admit(call) {
    return {
      backendBody: call.body,
      signal: NEVER,
      async deliver() {},
      async complete() {},
      end() {},
    };
  },
};
