// `episodeIdList` (control requests' `episode_ids`) must answer exactly as `z.array(EpisodeIdSchema)`
// did, and `captureKeyList` (snapshot manifests) as `z.array(CaptureKeySchema)`: the same values,
// and for a refused element the same issues at the same paths.
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { CaptureKeySchema, EpisodeIdSchema, captureKeyList, episodeIdList } from '../../protocol/ids.js';

const asBefore = z.strictObject({ e: z.array(EpisodeIdSchema).min(1) });
const now = z.strictObject({ e: episodeIdList(1) });

const outcome = (r: { success: true; data: unknown } | { success: false; error: z.ZodError }) =>
  r.success ? { data: r.data } : { issues: r.error.issues.map((i) => [i.code, i.path, i.message]) };

describe('episodeIdList', () => {
  it.each([
    ['valid, attempt defaulted', [{ rollout_id: 'a' }, { rollout_id: 'b.c_d-e', attempt: 3 }]],
    ['empty (min 1)', []],
    ['a reserved suffix', [{ rollout_id: 'a', attempt: 2 }, { rollout_id: 'b-a1' }]],
    ['an unknown key', [{ rollout_id: 'x', extra: 1 }]],
    ['several problems in one element', [{ rollout_id: '', attempt: -1 }]],
    ['not an array', 'nope'],
    ['non-objects and a fractional attempt', [1, null, { rollout_id: 'ok', attempt: 1.5 }]],
    ['an attempt beyond 2^53', [{ rollout_id: 'a', attempt: 2 ** 53 }]],
  ])('%s', (_name, e) => {
    expect(outcome(now.safeParse({ e }))).toEqual(outcome(asBefore.safeParse({ e })));
  });
});

describe('captureKeyList', () => {
  const keysBefore = z.strictObject({ k: z.array(CaptureKeySchema) });
  const keysNow = z.strictObject({ k: captureKeyList() });
  it.each([
    ['valid, with and without an attempt suffix', ['a', 'b.c_d-e-a3', 'x-a0']],
    ['empty', []],
    ['a key that is not a rollout ID', ['ok', 'bad key', '-a1']],
    ['non-strings', [1, null, { rollout_id: 'a' }]],
    ['not an array', 'nope'],
  ])('%s', (_name, k) => {
    expect(outcome(keysNow.safeParse({ k }))).toEqual(outcome(keysBefore.safeParse({ k })));
  });
});
