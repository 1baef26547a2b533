// A fault schedule drawn from a seed: what goes wrong, and when, in one short training run. Pure
// and deterministic (the same seed draws the same schedule), so a failing seed reruns alone.

export type FaultKind =
  /** SIGKILL every Gym process, then start fresh ones after a pause. */
  | 'gym_kill'
  /** SIGKILL one Gym server, then start a fresh one after a pause. */
  | 'server_kill'
  /** SIGKILL the controller's worker, then start a new one. */
  | 'worker_kill'
  /**
   * The worker SIGKILLs itself right after it sends completed reports to a shard, before their
   * activities complete (scripts/chaos/signal-kill.mjs); then a new one starts.
   */
  | 'report_kill'
  /**
   * The worker SIGKILLs itself right after a checkpoint attempt sent a shard its candidates request
   * (a checkpoint is requested to set it off), before the attempt's workflow task completed
   * (scripts/chaos/signal-kill.mjs); then a new one starts.
   */
  | 'cut_kill'
  /**
   * The worker SIGKILLs itself right after a checkpoint attempt released the shards' holds (its
   * snapshot published, Gym resumed), before the attempt's workflow task completed; then a new one starts.
   */
  | 'release_kill'
  /** SIGKILL the Temporal dev server, then restart it on the same database. */
  | 'temporal_restart'
  /** SIGSTOP one Gym server for a few seconds, then SIGCONT. */
  | 'server_stop'
  /** A manual checkpoint (`checkpoint-now`) racing whatever else is going on. */
  | 'manual_checkpoint';

export const FAULT_KINDS: readonly FaultKind[] = [
  'gym_kill',
  'server_kill',
  'worker_kill',
  'report_kill',
  'temporal_restart',
  'server_stop',
  'manual_checkpoint',
  'cut_kill',
  'release_kill',
];

/** When a fault fires, counted from the previous fault (or the run's start for the first). */
export type FaultTrigger =
  /** After this long. */
  | { on: 'time'; afterMs: number }
  /** Once the run has trained this many steps. */
  | { on: 'step'; step: number }
  /** `delayMs` after the run opens its first checkpoint attempt once `afterMs` have passed (prepare, commit, publish…). */
  | { on: 'checkpoint'; afterMs: number; delayMs: number };

export interface Fault {
  kind: FaultKind;
  trigger: FaultTrigger;
  /** Model calls held at the backend from this many calls per rollout, so a checkpoint catches episodes mid-turn. */
  holdAfterCalls?: number;
  /** How long the fault lasts: the pause before a restart, or the SIGSTOP. */
  downMs: number;
  /** The Gym server it hits (server_kill, server_stop). */
  server?: string;
  /** server_kill of a multi-worker deployment: SIGKILL only this worker (the server goes down with it). */
  worker?: number;
}

export interface Schedule {
  seed: number;
  steps: number;
  faults: Fault[];
}

/** mulberry32: a small, well-mixed 32-bit generator; enough to draw schedules, not cryptography. */
export function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

export interface ScheduleOptions {
  /** The Gym servers a fault may pick (not the inference backend: it is not part of Gym). */
  servers: readonly string[];
  /** Worker processes per Gym server (`--workers`); with more than one, half the server kills hit one worker. */
  workers?: number;
}

const WEIGHTS: Record<FaultKind, number> = {
  gym_kill: 5,
  server_kill: 4,
  worker_kill: 3,
  report_kill: 2,
  temporal_restart: 2,
  server_stop: 2,
  manual_checkpoint: 2,
  cut_kill: 2,
  release_kill: 2,
};

export function drawSchedule(seed: number, opts: ScheduleOptions): Schedule {
  const rnd = random(seed);
  const int = (lo: number, hi: number): number => lo + Math.floor(rnd() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  const kind = (): FaultKind => {
    const total = FAULT_KINDS.reduce((n, k) => n + WEIGHTS[k], 0);
    let x = rnd() * total;
    for (const k of FAULT_KINDS) {
      x -= WEIGHTS[k];
      if (x < 0) return k;
    }
    return 'gym_kill';
  };
  const steps = int(5, 6);
  const n = int(1, 4);
  const faults: Fault[] = [];
  let step = 0;
  for (let i = 0; i < n; i++) {
    let k = kind();
    // One Gym crash in three schedules is followed by a second: the case that used to end runs.
    if (i === 1 && faults[0]!.kind === 'gym_kill' && rnd() < 0.5) k = 'gym_kill';
    const r = rnd();
    let trigger: FaultTrigger;
    // Spread over the run (a minute or two), not bunched at its start before any snapshot exists.
    if (r < 0.35) trigger = { on: 'checkpoint', afterMs: int(0, 12_000), delayMs: int(0, 400) };
    else if (r < 0.6 && step < steps - 1) trigger = { on: 'step', step: (step = int(step + 1, steps - 1)) };
    else trigger = { on: 'time', afterMs: int(500, 15_000) };
    const fault: Fault = {
      kind: k,
      trigger,
      downMs: k === 'server_stop' ? int(1_000, 6_000) : k === 'manual_checkpoint' ? 0 : int(0, 8_000),
    };
    if (k === 'server_kill' || k === 'server_stop') fault.server = pick(opts.servers);
    // Drawn only with workers, so the schedules of a single-process deployment stay as they were.
    const workers = opts.workers ?? 1;
    if (k === 'server_kill' && workers > 1 && rnd() < 0.5) fault.worker = int(0, workers - 1);
    // Half the checkpoint-aimed faults hold model calls first, so the checkpoint parks episodes mid-turn.
    if (trigger.on === 'checkpoint' && rnd() < 0.5) fault.holdAfterCalls = int(1, 3);
    faults.push(fault);
  }
  return { seed, steps, faults };
}

/** `gym_kill@ckpt+120ms(hold 2)`, `server_kill:counter@step 3`, … */
export function describeFault(f: Fault): string {
  const t = f.trigger;
  const at = t.on === 'time' ? `${t.afterMs}ms` : t.on === 'step' ? `step ${t.step}` : `${t.afterMs}ms,ckpt+${t.delayMs}ms`;
  const down = f.downMs > 0 ? ` down ${(f.downMs / 1000).toFixed(1)}s` : '';
  return `${f.kind}${f.server ? `:${f.server}` : ''}${f.worker !== undefined ? `/w${f.worker}` : ''}@${at}${f.holdAfterCalls !== undefined ? ` hold ${f.holdAfterCalls}` : ''}${down}`;
}

/** Faults that crash Gym processes (all of them, or one server). */
export function gymCrashes(s: Schedule): number {
  return s.faults.filter((f) => f.kind === 'gym_kill' || f.kind === 'server_kill').length;
}
