// The shared step model (participants.md §1.6): states, boundaries, wait/replay steps, parking,
// restarts, retire, and the pausable episode deadline — one test group per rule, no HTTP.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { SteadyObjects } from '../../servers/control/ahead.js';
import { EpisodeCancelled, EpisodeSteps } from '../../servers/environment/episode-steps.js';
import { PausableDeadline } from '../../servers/environment/pausable-deadline.js';

/** Lets pending promise callbacks run. */
const flush = async (n = 5): Promise<void> => {
  for (let i = 0; i < n; i++) await Promise.resolve();
};

function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Tracks a promise's settlement without awaiting it. */
function track<T>(p: Promise<T>): { settled: () => boolean; error: () => unknown; value: () => T | undefined } {
  let settled = false;
  let error: unknown;
  let value: T | undefined;
  p.then(
    (v) => {
      settled = true;
      value = v;
    },
    (e: unknown) => {
      settled = true;
      error = e;
    },
  );
  return { settled: () => settled, error: () => error, value: () => value };
}

function tracker(): { steps: EpisodeSteps; notified: () => number } {
  let n = 0;
  const steps = new EpisodeSteps(() => {
    n += 1;
  });
  return { steps, notified: () => n };
}

afterEach(() => {
  vi.useRealTimers();
});

describe('begin, states and blockers', () => {
  it('a new episode is running and blocks until it records a boundary or enters a replay step', () => {
    const { steps } = tracker();
    steps.begin('r1');
    expect(steps.stateOf('r1')).toBe('running');
    expect(steps.blockerCount).toBe(1);
    expect(steps.ready()).toBe(false);
    expect(steps.blockers()).toEqual(['r1']);
    expect(() => steps.begin('r1')).toThrow(/already running/);
  });

  it('the blocker count follows every state change and end()', async () => {
    const { steps } = tracker();
    steps.begin('a');
    steps.begin('b');
    expect(steps.blockerCount).toBe(2);
    const gate = deferred();
    const replay = steps.step('a', 'replay', () => gate.promise);
    expect(steps.stateOf('a')).toBe('replay_step');
    expect(steps.blockerCount).toBe(1);
    const wait = steps.step('b', 'wait', () => Promise.resolve(7));
    expect(steps.stateOf('b')).toBe('wait_step');
    expect(steps.blockerCount).toBe(1); // a: replay step (not a blocker), b: wait step
    expect(await wait).toBe(7);
    expect(steps.stateOf('b')).toBe('running');
    gate.resolve();
    await replay;
    expect(steps.stateOf('a')).toBe('running');
    steps.end('a');
    steps.end('b');
    expect(steps.blockerCount).toBe(0);
    expect(steps.size).toBe(0);
    expect(steps.ready()).toBe(true);
  });

  it('notifies only while a checkpoint is open', async () => {
    const { steps, notified } = tracker();
    steps.begin('r');
    await steps.boundary('r', { next: 'x' });
    await steps.step('r', 'wait', async () => undefined);
    steps.end('r');
    expect(notified()).toBe(0);
    steps.close();
    steps.begin('s');
    expect(notified()).toBeGreaterThan(0);
  });

  it('carried restarts of other participants are excused from readiness', () => {
    const { steps } = tracker();
    steps.begin('a');
    expect(steps.ready(new Set(['a']))).toBe(true);
    expect(steps.ready(new Set(['b']))).toBe(false);
  });
});

describe('rule 1: recording a boundary', () => {
  it('with no checkpoint open just stores it and sets running', async () => {
    const { steps } = tracker();
    steps.begin('r');
    await steps.boundary('r', { next: 'seed' });
    expect(steps.stateOf('r')).toBe('running');
    expect(steps.boundaryOf('r')).toEqual({ next: 'seed' });
  });

  it('with a checkpoint open parks until resume (not a blocker meanwhile) and notifies', async () => {
    const { steps, notified } = tracker();
    steps.begin('r');
    steps.close();
    expect(steps.ready()).toBe(false);
    const before = notified();
    const b = track(steps.boundary('r', { next: 'invoke_agent' }));
    await flush();
    expect(steps.stateOf('r')).toBe('parked');
    expect(steps.ready()).toBe(true);
    expect(notified()).toBeGreaterThan(before);
    expect(b.settled()).toBe(false);
    steps.open();
    await flush();
    expect(b.settled()).toBe(true);
    expect(b.error()).toBeUndefined();
    expect(steps.stateOf('r')).toBe('running');
  });

  it('stays parked when a new checkpoint closes admission before the episode wakes', async () => {
    const { steps } = tracker();
    steps.begin('r');
    steps.close();
    const b = track(steps.boundary('r', { next: 'verify' }));
    await flush();
    steps.open();
    steps.close(); // the next checkpoint, in the same tick
    await flush();
    expect(b.settled()).toBe(false);
    expect(steps.stateOf('r')).toBe('parked');
    steps.open();
    await flush();
    expect(b.settled()).toBe(true);
  });

  it('a retire while parked ends the wait with cancellation', async () => {
    const { steps } = tracker();
    steps.begin('r');
    steps.close();
    const b = track(steps.boundary('r', { next: 'verify' }));
    await flush();
    const retired = steps.retire('r');
    await flush();
    expect(b.settled()).toBe(true);
    expect(b.error()).toBeInstanceOf(EpisodeCancelled);
    await retired;
    expect(steps.has('r')).toBe(false);
  });

  it('the wait also ends when the episode signal aborts', async () => {
    const { steps } = tracker();
    steps.begin('r');
    steps.close();
    const ac = new AbortController();
    const b = track(steps.boundary('r', { next: 'x' }, ac.signal));
    await flush();
    ac.abort(new Error('stop'));
    await flush();
    expect((b.error() as Error).message).toBe('stop');
  });

  it('boundary thunks are evaluated only when exported', async () => {
    const { steps } = tracker();
    const thunk = vi.fn(() => ({ next: 'close_agent', response: { id: 'resp' } }));
    steps.begin('r');
    steps.close();
    const b = steps.boundary('r', thunk);
    await flush();
    expect(thunk).not.toHaveBeenCalled();
    expect(steps.exported().get('r')).toEqual({ next: 'close_agent', response: { id: 'resp' } });
    expect(thunk).toHaveBeenCalledTimes(1);
    steps.open();
    await b;
  });

  it("a recorded boundary's JSON text is made once, by the first export, and dropped with the boundary", async () => {
    const { steps } = tracker();
    const thunk = vi.fn(() => ({ next: 'close_agent', response: { id: 'resp' } }));
    steps.begin('r');
    steps.close();
    const b = steps.boundary('r', thunk);
    await flush();
    const first = steps.exportedTexts().get('r');
    expect(first?.text).toBe('{"next":"close_agent","response":{"id":"resp"}}');
    expect(steps.exportedTexts().get('r')).toBe(first);
    expect(thunk).toHaveBeenCalledTimes(1);
    steps.open();
    await b;
    steps.close();
    const next = steps.boundary('r', { next: 'verify' });
    await flush();
    expect(steps.exportedTexts().get('r')?.text).toBe('{"next":"verify"}');
    steps.open();
    await next;
  });

  it('stages the text of a boundary that stood across two scans, the one the export then takes', async () => {
    const { steps } = tracker();
    const steady = new SteadyObjects();
    const thunk = vi.fn(() => ({ next: 'invoke_agent', turn: 3 }));
    steps.begin('r');
    steps.begin('moving');
    await steps.boundary('r', thunk);
    await steps.boundary('moving', { next: 'seed' });
    const agentCall = deferred<string>();
    const call = steps.step('r', 'replay', () => agentCall.promise); // parked on a call: exportable
    expect([...steps.stageTexts(steady)]).toHaveLength(0); // first sighting
    expect(thunk).not.toHaveBeenCalled();
    expect([...steps.stageTexts(steady)]).toHaveLength(1); // stood for a scan; 'moving' is running
    expect(thunk).toHaveBeenCalledTimes(1);
    expect([...steps.stageTexts(steady)]).toHaveLength(0); // made already
    steps.close();
    expect(steps.exportedTexts().get('r')?.text).toBe('{"next":"invoke_agent","turn":3}');
    expect(thunk).toHaveBeenCalledTimes(1);
    steps.open();
    agentCall.resolve('done');
    await call;
  });
});

describe('rule 2: a replay step that completes while a checkpoint is open', () => {
  it('stays replay_step, counted at the earlier boundary, until the next boundary parks it', async () => {
    const { steps } = tracker();
    steps.begin('r');
    await steps.boundary('r', { next: 'seed' });
    const gate = deferred<string>();
    const s = track(steps.step('r', 'replay', () => gate.promise));
    steps.close();
    expect(steps.ready()).toBe(true); // prepare does not wait for a replay step
    gate.resolve('seeded');
    await flush();
    expect(s.value()).toBe('seeded');
    expect(steps.stateOf('r')).toBe('replay_step');
    expect(steps.ready()).toBe(true);
    expect(steps.exported().get('r')).toEqual({ next: 'seed' });
    const b = track(steps.boundary('r', { next: 'invoke_agent' }));
    await flush();
    expect(steps.stateOf('r')).toBe('parked');
    expect(steps.exported().get('r')).toEqual({ next: 'invoke_agent' });
    steps.open();
    await flush();
    expect(b.settled()).toBe(true);
  });

  it('a replay step without a checkpoint goes back to running when it ends', async () => {
    const { steps } = tracker();
    steps.begin('r');
    await steps.step('r', 'replay', async () => undefined);
    expect(steps.stateOf('r')).toBe('running');
    expect(steps.blockerCount).toBe(1);
  });
});

describe('rule 3: a replay step that raises while a checkpoint is open', () => {
  it('clears the boundary, is not a blocker, and holds its cleanup until resume', async () => {
    const { steps } = tracker();
    steps.begin('r');
    await steps.boundary('r', { next: 'invoke_agent', handles: {} });
    const gate = deferred();
    const s = track(steps.step('r', 'replay', () => gate.promise));
    steps.close();
    gate.reject(new Error('agent failed'));
    await flush();
    expect((s.error() as Error).message).toBe('agent failed');
    expect(steps.stateOf('r')).toBe('replay_step');
    expect(steps.blockerCount).toBe(0);
    expect(steps.ready()).toBe(true);
    expect(steps.exported().get('r')).toBeNull();
    const hold = track(steps.awaitRelease('r'));
    await flush();
    expect(hold.settled()).toBe(false);
    steps.open();
    await flush();
    expect(hold.settled()).toBe(true);
  });

  it('awaitRelease resolves at once when nothing holds the episode, and when it is retired', async () => {
    const { steps } = tracker();
    steps.begin('r');
    await steps.awaitRelease('r'); // no checkpoint
    steps.close();
    await steps.awaitRelease('r'); // running: a blocker, not held
    const gate = deferred();
    const s = steps.step('r', 'replay', () => gate.promise).catch(() => undefined);
    gate.reject(new Error('x'));
    await s;
    const hold = track(steps.awaitRelease('r'));
    await flush();
    expect(hold.settled()).toBe(false);
    void steps.retire('r');
    await flush();
    expect(hold.settled()).toBe(true);
  });
});

describe('rule 4: any other step that raises', () => {
  it('a wait step that raises goes back to running and blocks until the episode ends', async () => {
    const { steps } = tracker();
    steps.begin('r');
    steps.close();
    await expect(steps.step('r', 'wait', () => Promise.reject(new Error('close failed')))).rejects.toThrow('close failed');
    expect(steps.stateOf('r')).toBe('running');
    expect(steps.ready()).toBe(false);
    steps.end('r');
    expect(steps.ready()).toBe(true);
  });

  it('a replay step that raises with no checkpoint open goes back to running', async () => {
    const { steps } = tracker();
    steps.begin('r');
    await steps.boundary('r', { next: 'seed' });
    await expect(steps.step('r', 'replay', () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
    expect(steps.stateOf('r')).toBe('running');
    expect(steps.boundaryOf('r')).toEqual({ next: 'seed' });
    expect(steps.blockerCount).toBe(1);
  });

  it('a wait step in flight blocks prepare until it finishes; the next boundary then parks', async () => {
    const { steps } = tracker();
    steps.begin('r');
    const gate = deferred();
    const s = steps.step('r', 'wait', () => gate.promise);
    steps.close();
    expect(steps.ready()).toBe(false);
    expect(steps.blockers()).toEqual(['r']);
    gate.resolve();
    await s;
    expect(steps.ready()).toBe(false); // running again until it records its boundary
    const b = steps.boundary('r', { next: 'verify' });
    await flush();
    expect(steps.ready()).toBe(true);
    expect(steps.exported().get('r')).toEqual({ next: 'verify' });
    steps.open();
    await b;
  });
});

describe('rule 5: time parked does not count toward the deadline', () => {
  it('the remaining budget is frozen at park and restored at resume', async () => {
    vi.useFakeTimers();
    const { steps } = tracker();
    const expired = vi.fn();
    const deadline = new PausableDeadline(10_000, expired);
    steps.begin('r', { deadline });
    vi.advanceTimersByTime(4_000);
    steps.close();
    const b = steps.boundary('r', { next: 'x' });
    expect(deadline.suspended).toBe(true);
    vi.advanceTimersByTime(60_000);
    expect(expired).not.toHaveBeenCalled();
    expect(deadline.remainingMs).toBe(6_000);
    steps.open();
    await b;
    vi.advanceTimersByTime(5_999);
    expect(expired).not.toHaveBeenCalled();
    vi.advanceTimersByTime(1);
    expect(expired).toHaveBeenCalledTimes(1);
  });

  it('closing admission suspends the deadlines of replay-step episodes; a wait step keeps running', async () => {
    vi.useFakeTimers();
    const { steps } = tracker();
    const replayDeadline = new PausableDeadline(1_000, () => undefined);
    const waitDeadline = new PausableDeadline(1_000, () => undefined);
    steps.begin('replay', { deadline: replayDeadline });
    steps.begin('wait', { deadline: waitDeadline });
    const g1 = deferred();
    const g2 = deferred();
    const s1 = steps.step('replay', 'replay', () => g1.promise);
    const s2 = steps.step('wait', 'wait', () => g2.promise);
    steps.close();
    expect(replayDeadline.suspended).toBe(true);
    expect(waitDeadline.suspended).toBe(false);
    g1.resolve();
    g2.resolve();
    await Promise.all([s1, s2]);
    // The completed replay step stays counted at its boundary: its clock stays stopped.
    expect(replayDeadline.suspended).toBe(true);
    steps.open();
    expect(replayDeadline.suspended).toBe(false);
  });

  it('a replay step started while a checkpoint is open does not run the clock', () => {
    vi.useFakeTimers();
    const { steps } = tracker();
    const deadline = new PausableDeadline(1_000, () => undefined);
    steps.begin('r', { deadline, restart: true });
    steps.close();
    void steps.step('r', 'replay', () => new Promise(() => undefined));
    expect(deadline.suspended).toBe(true);
  });
});

describe('rule 6: restarts', () => {
  it('a restart never blocks, never parks, is never exported, and is listed in restarts', async () => {
    const { steps } = tracker();
    steps.begin('r', { restart: true });
    expect(steps.blockerCount).toBe(0);
    steps.close();
    await steps.boundary('r', { next: 'seed' }); // does not park
    expect(steps.stateOf('r')).toBe('running');
    await steps.step('r', 'wait', async () => undefined);
    expect(steps.ready()).toBe(true);
    expect(steps.exported().size).toBe(0);
    expect(steps.restarts()).toEqual(['r']);
  });

  it('mark_restart waits while a checkpoint is open, then stops blocking', async () => {
    const { steps } = tracker();
    steps.begin('r');
    steps.close();
    const m = track(steps.markRestart('r'));
    await flush();
    expect(m.settled()).toBe(false);
    expect(steps.isRestart('r')).toBe(false);
    expect(steps.restarts()).toEqual([]);
    steps.open();
    await flush();
    expect(m.settled()).toBe(true);
    expect(steps.isRestart('r')).toBe(true);
    expect(steps.blockerCount).toBe(0);
    expect(steps.restarts()).toEqual(['r']);
  });

  it('mark_restart without a checkpoint is immediate; a retire during its wait cancels it', async () => {
    const { steps } = tracker();
    steps.begin('a');
    await steps.markRestart('a');
    expect(steps.isRestart('a')).toBe(true);
    steps.begin('b', { done: new Promise(() => undefined) });
    steps.close();
    const m = track(steps.markRestart('b'));
    await flush();
    void steps.retire('b');
    await flush();
    expect(m.error()).toBeInstanceOf(EpisodeCancelled);
  });

  it('a restart being retired is no longer listed in restarts but blocks', async () => {
    const { steps } = tracker();
    const done = deferred();
    steps.begin('r', { restart: true, done: done.promise });
    const r = steps.retire('r');
    expect(steps.restarts()).toEqual([]);
    expect(steps.blockers()).toEqual(['r']);
    done.resolve();
    await r;
    expect(steps.size).toBe(0);
  });
});

describe('rule 7: the exported boundary', () => {
  it('is the latest boundary of parked and replay-step episodes only; null = start over from input', async () => {
    const { steps } = tracker();
    steps.begin('parked');
    steps.begin('fresh-replay');
    steps.begin('running');
    steps.begin('restart', { restart: true });
    await steps.boundary('parked', { next: 'seed' });
    await steps.boundary('restart', { next: 'seed' });
    void steps.step('fresh-replay', 'replay', () => new Promise(() => undefined));
    void steps.step('restart', 'replay', () => new Promise(() => undefined));
    steps.close();
    void steps.boundary('parked', { next: 'verify' });
    await flush();
    const out = steps.exported();
    expect(Object.fromEntries(out)).toEqual({ parked: { next: 'verify' }, 'fresh-replay': null });
    expect(steps.blockers()).toEqual(['running']);
  });

  it('an episode being retired is not exported', async () => {
    const { steps } = tracker();
    steps.begin('r', { done: new Promise(() => undefined) });
    steps.close();
    void steps.boundary('r', { next: 'seed' }).catch(() => undefined);
    await flush();
    void steps.retire('r');
    expect(steps.exported().size).toBe(0);
    expect(steps.blockers()).toEqual(['r']);
  });
});

describe('rule 8: a restored episode', () => {
  it('starts at its restored boundary, re-exported until it records a new one; the continuation is handed out once', async () => {
    const { steps } = tracker();
    const restored = { next: 'close_agent', handles: { agent_session_id: 'a' }, response: { id: 'resp' } };
    steps.begin('r-a1', { continuation: restored });
    expect(steps.continuation('r-a1')).toEqual(restored);
    expect(steps.continuation('r-a1')).toBeNull();
    const gate = deferred();
    void steps.step('r-a1', 'replay', () => gate.promise);
    steps.close();
    expect(steps.exported().get('r-a1')).toEqual(restored);
    gate.resolve();
  });
});

describe('retire', () => {
  it('blocks, wakes, cancels once, waits for the work to end, then untracks', async () => {
    const { steps } = tracker();
    const done = deferred();
    const cancel = vi.fn();
    steps.begin('r', { cancel, done: done.promise });
    await steps.boundary('r', { next: 'seed' });
    void steps.step('r', 'replay', () => new Promise(() => undefined));
    expect(steps.blockerCount).toBe(0);
    const r = track(steps.retire('r'));
    expect(cancel).toHaveBeenCalledTimes(1);
    expect(steps.blockerCount).toBe(1); // being retired blocks whatever its state
    expect(steps.isRetiring('r')).toBe(true);
    await flush();
    expect(r.settled()).toBe(false);
    expect(steps.has('r')).toBe(true);
    done.resolve();
    await flush();
    expect(r.settled()).toBe(true);
    expect(steps.has('r')).toBe(false);
    expect(steps.blockerCount).toBe(0);
  });

  it('cut short it stays tracked and blocking; a retried retire waits again without cancelling twice', async () => {
    const { steps } = tracker();
    const done = deferred();
    const cancel = vi.fn();
    steps.begin('r', { cancel, done: done.promise });
    const ac = new AbortController();
    const first = track(steps.retire('r', ac.signal));
    ac.abort(new Error('deadline'));
    await flush();
    expect((first.error() as Error).message).toBe('deadline');
    expect(steps.has('r')).toBe(true);
    expect(steps.blockers()).toEqual(['r']);
    const second = track(steps.retire('r'));
    await flush();
    expect(cancel).toHaveBeenCalledTimes(1);
    expect(second.settled()).toBe(false);
    done.resolve();
    await flush();
    expect(second.settled()).toBe(true);
    expect(steps.has('r')).toBe(false);
  });

  it('never cancels once final cleanup started (finishing), but still waits for it', async () => {
    const { steps } = tracker();
    const done = deferred();
    const cancel = vi.fn();
    steps.begin('r', { cancel, done: done.promise });
    steps.finishing('r');
    const r = track(steps.retire('r'));
    await flush();
    expect(cancel).not.toHaveBeenCalled();
    expect(r.settled()).toBe(false);
    steps.end('r'); // the owner untracks at its end; the retire still waits for the work
    done.resolve();
    await flush();
    expect(r.settled()).toBe(true);
  });

  it('a retired episode cannot record another boundary', async () => {
    const { steps } = tracker();
    steps.begin('r', { done: new Promise(() => undefined) });
    void steps.retire('r');
    await expect(steps.boundary('r', { next: 'x' })).rejects.toBeInstanceOf(EpisodeCancelled);
  });

  it('retiring an unknown episode is a no-op', async () => {
    const { steps } = tracker();
    await steps.retire('nope');
    expect(steps.size).toBe(0);
  });
});

describe('PausableDeadline', () => {
  it('fires once after its budget; cancel stops it; null means no deadline', () => {
    vi.useFakeTimers();
    const fired = vi.fn();
    const d = new PausableDeadline(100, fired);
    vi.advanceTimersByTime(99);
    expect(fired).not.toHaveBeenCalled();
    vi.advanceTimersByTime(1);
    expect(fired).toHaveBeenCalledTimes(1);
    expect(d.expired).toBe(true);
    const c = vi.fn();
    const d2 = new PausableDeadline(100, c);
    d2.cancel();
    vi.advanceTimersByTime(1_000);
    expect(c).not.toHaveBeenCalled();
    const none = new PausableDeadline(null, c);
    none.suspend();
    none.resume();
    expect(none.remainingMs).toBeNull();
  });

  it('suspend and resume are idempotent', () => {
    vi.useFakeTimers();
    const fired = vi.fn();
    const d = new PausableDeadline(1_000, fired);
    vi.advanceTimersByTime(300);
    d.suspend();
    d.suspend();
    vi.advanceTimersByTime(10_000);
    d.resume();
    d.resume();
    expect(d.remainingMs).toBe(700);
    vi.advanceTimersByTime(700);
    expect(fired).toHaveBeenCalledTimes(1);
  });
});
