// How the answers of a multi-worker server's workers become the one participant's answer
// (docs/multi-worker.md). Pure, unit-tested: counts add up, lists join (sorted, no duplicates),
// readiness needs every worker, the identity is the front's.
import { buildReport, type Phase, type PrepareReport, type StatusReply } from '../../protocol/control.js';

const PHASE_ORDER: readonly Phase[] = ['idle', 'restored', 'preparing', 'prepared', 'committed'];

/** One report for the whole server: ready when every worker is. */
export function mergeReports(reports: readonly PrepareReport[]): PrepareReport {
  const counts: Record<string, number> = {};
  for (const r of reports) for (const [k, v] of Object.entries(r.counts)) counts[k] = (counts[k] ?? 0) + v;
  const merged = buildReport({
    ready: reports.every((r) => r.ready),
    blockers: reports.flatMap((r) => r.blockers),
    counts,
    restarts: reports.flatMap((r) => r.restarts),
  });
  // A worker lists at most 100 of its blockers but counts them all.
  merged.blocker_count = Math.max(
    merged.blocker_count,
    reports.reduce((n, r) => n + r.blocker_count, 0),
  );
  return merged;
}

/**
 * Kind-specific fields (status extras, commit reply extras): lists joined, maps merged, numbers
 * added, flags true only if true everywhere; anything else as the first worker says.
 */
export function mergeExtras(parts: ReadonlyArray<Record<string, unknown>>): Record<string, unknown> {
  // One pass over the parts' keys: per-episode maps (a model's staging keys by episode) have
  // thousands of keys, each in one worker's part only.
  const byKey = new Map<string, unknown[]>();
  for (const part of parts) {
    for (const key of Object.keys(part)) {
      const value = part[key];
      if (value === undefined) continue;
      const values = byKey.get(key);
      if (values) values.push(value);
      else byKey.set(key, [value]);
    }
  }
  const out: Record<string, unknown> = {};
  for (const [key, values] of byKey) out[key] = mergeValues(values);
  return out;
}

function mergeValues(values: unknown[]): unknown {
  if (values.every(Array.isArray)) return joinLists(values as unknown[][]);
  if (values.every((v) => typeof v === 'number')) return (values as number[]).reduce((a, b) => a + b, 0);
  if (values.every((v) => typeof v === 'boolean')) return values.every(Boolean);
  if (values.every(isPlainObject)) return mergeExtras(values as Array<Record<string, unknown>>);
  return values[0];
}

/** The sorted union of the workers' key lists (each already sorted, as every reply lists keys). */
export function unionOfKeys(lists: readonly string[][]): string[] {
  return joinLists(lists as unknown[][]) as string[];
}

function joinLists(lists: unknown[][]): unknown[] {
  // Workers' lists come sorted without duplicates: then one linear merge is the join.
  if (lists.every(isSortedUniqueStrings)) return lists.length === 1 ? lists[0]! : lists.reduce((a, b) => mergeSorted(a as string[], b as string[]));
  const all = lists.flat();
  if (!all.every((v) => typeof v === 'string')) return all;
  return [...new Set(all as string[])].sort();
}

/** The sorted union of two sorted lists without duplicates. */
function mergeSorted(a: readonly string[], b: readonly string[]): string[] {
  const out: string[] = [];
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    if (a[i]! < b[j]!) out.push(a[i++]!);
    else if (b[j]! < a[i]!) out.push(b[j++]!);
    else {
      out.push(a[i++]!);
      j++;
    }
  }
  while (i < a.length) out.push(a[i++]!);
  while (j < b.length) out.push(b[j++]!);
  return out;
}

function isSortedUniqueStrings(list: unknown[]): boolean {
  for (let i = 0; i < list.length; i++) {
    const v = list[i];
    if (typeof v !== 'string') return false;
    if (i > 0 && !((list[i - 1] as string) < v)) return false;
  }
  return true;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const CORE_STATUS = new Set(['kind', 'instance', 'phase', 'checkpoint_id', 'lease_expires_at', 'retired_rollouts', 'report', 'instance_id']);

/**
 * The server's status from its workers' (in worker order). Workers move through the phases
 * together; while one call is on its way through them the most advanced phase is shown, with its
 * checkpoint, so a controller never sees the server idle while a worker holds a checkpoint.
 */
export function mergeStatus(statuses: readonly StatusReply[], instanceId: string): StatusReply {
  const first = statuses[0]!;
  const lead = statuses.reduce((a, b) => (PHASE_ORDER.indexOf(b.phase) > PHASE_ORDER.indexOf(a.phase) ? b : a), first);
  const leases = statuses.map((s) => s.lease_expires_at).filter((v): v is number => v !== null);
  const extras = mergeExtras(statuses.map((s) => Object.fromEntries(Object.entries(s).filter(([k]) => !CORE_STATUS.has(k)))));
  return {
    ...extras,
    kind: first.kind,
    instance: first.instance,
    phase: lead.phase,
    checkpoint_id: lead.checkpoint_id,
    lease_expires_at: leases.length ? Math.min(...leases) : null,
    retired_rollouts: statuses.reduce((n, s) => n + s.retired_rollouts, 0),
    report: mergeReports(statuses.map((s) => s.report)),
    instance_id: instanceId,
    workers: statuses.length,
  };
}
