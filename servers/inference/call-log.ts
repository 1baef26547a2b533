// Every chat call the backend received, recorded on arrival (before any hold), so a test sees
// held calls too and can assert the exact sequence of model calls (participants.md §6.4).

export interface CallRecord {
  /** Global arrival index, from 0. */
  index: number;
  capture_key: string;
  rollout_id: string;
  attempt: number;
  n_messages: number;
  /** Arrival time, epoch seconds. */
  t: number;
  stream: boolean;
  situation: string;
  action: string;
  version: number;
  /** The policy model server's `ng_capture` admission, when the call came through a participant. */
  admission?: Record<string, unknown>;
  model_call_id?: string;
  /** Tokens decoded for this call so far (a continuation does not decode its reused prefix). */
  decoded_tokens: number;
  /** A continued generation cut: the model call whose staged prefix this call reused… */
  continued_from?: string;
  /** …and how many of its tokens. */
  reused_prefix_tokens?: number;
  /** Why a continuation was refused (the call was then decoded from scratch). */
  continuation_rejected?: string;
  /** Set once the whole reply was written. */
  returned?: boolean;
  /** Set when the client went away (or the server closed) before the reply was written. */
  abandoned?: boolean;
}

export type NewCall = Omit<CallRecord, 'index' | 't' | 'returned' | 'abandoned'>;

export class CallLog {
  private records: CallRecord[] = [];
  private perRollout = new Map<string, number>();

  /** Records a call; `prior` is how many calls its rollout (any attempt) made before it. */
  add(call: NewCall, now = Date.now()): { record: CallRecord; prior: number } {
    const prior = this.perRollout.get(call.rollout_id) ?? 0;
    this.perRollout.set(call.rollout_id, prior + 1);
    const record: CallRecord = { index: this.records.length, ...call, t: now / 1000 };
    this.records.push(record);
    return { record, prior };
  }

  get count(): number {
    return this.records.length;
  }

  list(): CallRecord[] {
    return this.records.map((r) => ({ ...r }));
  }

  reset(): void {
    this.records = [];
    this.perRollout.clear();
  }
}
