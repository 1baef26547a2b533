// How far a Gym server's V8 heap grows before its next full collection. V8 picks the factor from
// its collection speed against the allocation rate: a process that holds a big heap and allocates
// little between requests (a server with thousands of parked episodes) gets about 1.1–1.3 times its
// live heap, a few MB of slack, and a commit's own allocation started a full collection inside the
// checkpoint's window (GC traces in docs/performance.md). At twice the live heap a collection comes
// once the heap doubled, and a commit seldom brings one. The cost is memory: up to twice the live
// heap. The controller's worker keeps V8's own factor (docs/performance.md: tried, not kept).

/** The V8 flag the launcher starts every server with (its workers inherit it). */
export const HEAP_GROWING_FLAG = '--heap-growing-percent=100';
