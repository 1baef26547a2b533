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
  const out: Record<string, unknown> = {};
  const keys = new Set(parts.flatMap((p) => Object.keys(p)));
  for (const key of keys) {
    const values = parts.map((p) => p[key]).filter((v) => v !== undefined);
    if (values.every(Array.isArray)) out[key] = joinLists(values as unknown[][]);
    else if (values.every((v) => typeof v === 'number')) out[key] = (values as number[]).reduce((a, b) => a + b, 0);
    else if (values.every((v) => typeof v === 'boolean')) out[key] = values.every(Boolean);
    else if (values.every(isPlainObject)) out[key] = mergeExtras(values as Array<Record<string, unknown>>);
    else out[key] = values[0];
  }
  return out;
}

function joinLists(lists: unknown[][]): unknown[] {
  const all = lists.flat();
  if (!all.every((v) => typeof v === 'string')) return all;
  return [...new Set(all as string[])].sort();
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
