// The participant manifest, records file naming and the record (control-plane.md §9.2–9.4).
import { z } from 'zod';
import type { EpisodeId } from './episode-id.js';

export const MANIFEST_FILE = 'manifest.json';
export const SCHEMA_VERSION = 1;
/** `records-<sha256>.jsonl`, or the legacy `records.jsonl`; also keeps the name inside the directory. */
export const RECORDS_FILE_PATTERN = /^records(-[0-9a-f]{64})?\.jsonl$/;

export function recordsFileName(sha256Hex: string): string {
  return `records-${sha256Hex}.jsonl`;
}

/** Open object: kind-specific extras (e.g. `session_owners`) ride along and are kept. */
export const ManifestSchema = z.looseObject({
  schema_version: z.literal(SCHEMA_VERSION),
  kind: z.string(),
  instance: z.string(),
  checkpoint_id: z.string(),
  records_file: z.string().regex(RECORDS_FILE_PATTERN),
  records_sha256: z.string().regex(/^[0-9a-f]{64}$/),
  record_count: z.number().int().min(0),
});

export type Manifest = z.infer<typeof ManifestSchema>;

/** One checkpoint record (a records line): its episode first, then kind-specific fields (§9.4). */
export interface CheckpointRecord {
  episode_id: EpisodeId;
  [field: string]: unknown;
}
