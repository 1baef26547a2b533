// A commit's garbage, collected once its checkpoint released admission. A Gym server's commit of
// thousands of records promotes much of what it allocates (the scope, the records' batches, the
// parts) into the old generation; left alone, V8 starts its next full collection (incremental
// marking over a heap of every parked episode, on the main thread) in whichever later commit
// crosses the limit, and that checkpoint's admission stays closed for it. Collected right after the
// release instead, while the episodes go on, the next window starts with a heap that has room
// (docs/performance.md, "A commit's garbage collected after its release"). Not for the
// controller's worker: there a full collection of a heap holding every parked `/run` outlasted the
// time between checkpoints (docs/performance.md, "Where the worker's garbage comes from").
//
// V8 exposes a collection to JavaScript only with `--expose-gc`: the launcher starts the Gym servers
// with it (their workers inherit it); a server started without it skips this.

/** After the resume's reply has left (the front relays a worker's reply before the controller hears it). */
export const COLLECT_DELAY_MS = 200;

/** `gc()` with no argument: a full, atomic collection (with `{ type: 'major' }` this V8 collects much less). */
type Collect = () => void;

/** The collection `--expose-gc` provides, if this process has it. */
export function exposedCollector(): Collect | undefined {
  const gc = (globalThis as { gc?: Collect }).gc;
  return typeof gc === 'function' ? gc : undefined;
}

/**
 * Collects once, `delayMs` after a release, unless a checkpoint opened meanwhile (its window goes
 * first; its release schedules again). Returns whether one was scheduled.
 */
export function collectAfterRelease(stillIdle: () => boolean, collect = exposedCollector(), delayMs = COLLECT_DELAY_MS): boolean {
  if (!collect) return false;
  setTimeout(() => {
    if (stillIdle()) collect();
  }, delayMs).unref();
  return true;
}
