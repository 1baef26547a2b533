// Control-route bodies (control-plane.md §4–6, §14.1). Requests are closed (an unknown field is a
// 422) and accept both protocol layers; replies are parsed leniently because controllers must
// ignore unknown fields and accept both the baseline and the latest shapes.
import { z } from 'zod';
import { CaptureKeySchema, CheckpointIdSchema, type KindSchema, episodeIdList, captureKey, type CaptureKey, type EpisodeId } from './ids.js';
import { ManifestSchema } from './manifest.js';

export const CONTROL_PREFIX = '/ng-control/v1/checkpoint';
export const CONTROL_OPERATIONS = ['status', 'prepare', 'renew', 'commit', 'restore', 'resume', 'retire', 'forget'] as const;
export type ControlOperation = (typeof CONTROL_OPERATIONS)[number];

export const PHASES = ['idle', 'preparing', 'prepared', 'committed', 'restored'] as const;
export const PhaseSchema = z.enum(PHASES);
export type Phase = z.infer<typeof PhaseSchema>;

/** Absolute epoch seconds. Numeric strings are coerced like the reference does; never NaN/±Inf. */
export const DeadlineSchema = z
  .union([
    z.number(),
    z
      .string()
      .regex(/^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$/)
      .transform(Number),
  ])
  .refine((n) => Number.isFinite(n), 'deadline_ts must be a finite number');

const base = { checkpoint_id: CheckpointIdSchema, deadline_ts: DeadlineSchema };

export const CheckpointRequestSchema = z.strictObject(base);
export const PrepareRequestSchema = z.strictObject({
  ...base,
  restarts: z.array(CaptureKeySchema).optional(),
});
export const CommitRequestSchema = z.strictObject({
  ...base,
  checkpoint_dir: z.string().min(1),
  episode_ids: episodeIdList().nullable().default(null),
  stop: z.boolean().default(false),
});
export const RestoreRequestSchema = z.strictObject({
  ...base,
  checkpoint_dir: z.string().min(1),
  episode_ids: episodeIdList(),
});
export const RetireRequestSchema = z.strictObject({
  ...base,
  episode_ids: episodeIdList(1),
});
export const ForgetRequestSchema = z.strictObject({
  ...base,
  rollout_ids: z.array(z.string()).min(1),
});

export type CheckpointRequest = z.infer<typeof CheckpointRequestSchema>;
export type PrepareRequest = z.infer<typeof PrepareRequestSchema>;
export type CommitRequest = z.infer<typeof CommitRequestSchema>;
export type RestoreRequest = z.infer<typeof RestoreRequestSchema>;
export type RetireRequest = z.infer<typeof RetireRequestSchema>;
export type ForgetRequest = z.infer<typeof ForgetRequestSchema>;

export const REQUEST_SCHEMAS = {
  prepare: PrepareRequestSchema,
  renew: CheckpointRequestSchema,
  commit: CommitRequestSchema,
  restore: RestoreRequestSchema,
  resume: CheckpointRequestSchema,
  retire: RetireRequestSchema,
  forget: ForgetRequestSchema,
} as const;

// --- PrepareReport (§6) ----------------------------------------------------------------

export const BLOCKER_CAP = 100;

export const PrepareReportSchema = z.looseObject({
  ready: z.boolean(),
  blockers: z.array(z.string()),
  blocker_count: z.number().int().min(0).optional(),
  counts: z.record(z.string(), z.number()).default({}),
  restarts: z.array(z.string()).default([]),
});
export type PrepareReport = {
  ready: boolean;
  blockers: string[];
  blocker_count: number;
  counts: Record<string, number>;
  restarts: CaptureKey[];
};

/** Lists the first 100 blockers in sorted order and counts them all; restarts are never capped. */
export function buildReport(input: {
  ready: boolean;
  blockers: Iterable<string>;
  counts?: Record<string, number>;
  restarts?: Iterable<CaptureKey>;
}): PrepareReport {
  const all = [...new Set(input.blockers)].sort();
  return {
    ready: input.ready,
    blockers: all.slice(0, BLOCKER_CAP),
    blocker_count: all.length,
    counts: input.counts ?? {},
    restarts: [...new Set(input.restarts ?? [])].sort(),
  };
}

/** A report parsed from JSON: an existing `blocker_count` is taken as is (§6). */
export function normalizeReport(r: z.infer<typeof PrepareReportSchema>): PrepareReport {
  return {
    ready: r.ready,
    blockers: r.blockers,
    blocker_count: r.blocker_count ?? r.blockers.length,
    counts: r.counts,
    restarts: r.restarts,
  };
}

// --- Replies ---------------------------------------------------------------------------

export const StatusReplySchema = z.looseObject({
  kind: z.string(),
  instance: z.string(),
  phase: PhaseSchema,
  checkpoint_id: z.string().nullable(),
  lease_expires_at: z.number().nullable(),
  retired_rollouts: z.number().int().default(0),
  report: PrepareReportSchema,
});
export type StatusReply = {
  kind: z.infer<typeof KindSchema>;
  instance: string;
  phase: Phase;
  checkpoint_id: string | null;
  lease_expires_at: number | null;
  retired_rollouts: number;
  report: PrepareReport;
  [extra: string]: unknown;
};

export const PrepareReplySchema = z.looseObject({ phase: PhaseSchema, report: PrepareReportSchema });
export type PrepareReply = { phase: Phase; report: PrepareReport };

export const RenewReplySchema = z.looseObject({ lease_expires_at: z.number() });
export type RenewReply = { lease_expires_at: number };

export const CommitReplySchema = z.looseObject({
  phase: z.literal('committed'),
  manifest: ManifestSchema,
  episode_ids: z.array(z.string()),
});
export type CommitReply = z.infer<typeof CommitReplySchema>;

export const RestoreReplySchema = z.looseObject({
  phase: z.literal('restored'),
  source_checkpoint_id: z.string(),
  restored: z.array(z.string()),
});
export type RestoreReply = z.infer<typeof RestoreReplySchema>;

export const ResumeReplySchema = z.looseObject({ phase: z.literal('idle'), idempotent: z.boolean() });
export type ResumeReply = { phase: 'idle'; idempotent: boolean };

/** Latest: counts. Baseline: lists. Controllers accept both (§5.7, §5.8). */
export const RetireReplySchema = z.union([z.looseObject({ retired_count: z.number().int() }), z.looseObject({ retired: z.array(z.string()) })]);
export const ForgetReplySchema = z.union([z.looseObject({ forgotten_count: z.number().int() }), z.looseObject({ forgotten: z.array(z.string()) })]);
export type RetireReply = { retired_count: number };
export type ForgetReply = { forgotten_count: number };

/** Order-insensitive scope key; duplicates count; null and [] differ (§8.4). */
export function scopeKey(scope: readonly EpisodeId[] | null): string {
  if (scope === null) return 'none';
  return JSON.stringify(scope.map(captureKey).sort());
}
