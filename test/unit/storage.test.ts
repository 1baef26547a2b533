import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ProtocolError } from '../../protocol/errors.js';
import { DeferredJson, materialized } from '../../protocol/deferred-json.js';
import { LosslessNumber, OrderedObject, stringifyLossless } from '../../protocol/lossless-json.js';
import { MANIFEST_FILE, type CheckpointRecord } from '../../protocol/manifest.js';
import { participantDir } from '../../servers/control/storage/paths.js';
import { deferMinBytes, readRecords } from '../../servers/control/storage/reader.js';
import { startRecordsWrite, writeRecords } from '../../servers/control/storage/writer.js';
import { sleep } from '../helpers/wait.js';

const KIND = 'environment';
const INSTANCE = 'env_main';
const EMPTY_SHA = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855';

let root: string;
let ckpt: string;

beforeEach(() => {
  root = mkdtempSync(path.join(os.tmpdir(), 'storage-test-'));
  ckpt = path.join(root, 'ckpt');
});

afterEach(() => {
  rmSync(root, { recursive: true, force: true });
});

function dirOf(checkpointDir = ckpt, kind = KIND, instance = INSTANCE): string {
  return path.join(checkpointDir, 'gym', kind, instance);
}

function sha256(data: Buffer | string): string {
  return createHash('sha256').update(data).digest('hex');
}

function sampleRecords(): CheckpointRecord[] {
  return [
    {
      episode_id: { rollout_id: 'task1-roll0', attempt: 0 },
      task_digest: 'a'.repeat(64),
      boundary: { next: 'verify', seeded: true, big: 2n ** 70n, lp: -Infinity, f: new LosslessNumber('1.0') },
    },
    {
      episode_id: { rollout_id: 'task2-roll0', attempt: 2 },
      task_digest: 'b'.repeat(64),
      boundary: new OrderedObject([
        ['b', 1],
        ['2', 'two'],
        ['text', 'é東😀\n"q"'],
      ]),
    },
    { episode_id: { rollout_id: 'task3-roll1', attempt: 1 }, task_digest: 'c'.repeat(64), boundary: null },
  ];
}

async function write(records: Iterable<object> | AsyncIterable<object>, extra: Partial<Parameters<typeof writeRecords>[0]> = {}) {
  return writeRecords({ checkpointDir: ckpt, kind: KIND, instance: INSTANCE, checkpointId: 'ckpt-1', records, ...extra });
}

/** The field `read` defers (the corrupt-state cases run eager and deferred). */
let deferField: string | undefined;

async function read(scope: ReadonlySet<string> | null = null, validate?: (r: CheckpointRecord) => unknown, checkpointDir = ckpt) {
  return readRecords({ checkpointDir, kind: KIND, instance: INSTANCE, scope, validate, defer: deferField, deferMinBytes: 0 });
}

/** Rejects with invalid_checkpoint_state; returns the detail. */
async function refusal(p: Promise<unknown>): Promise<string> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ProtocolError);
  expect((err as ProtocolError).code).toBe('invalid_checkpoint_state');
  expect((err as ProtocolError).status).toBe(422);
  return (err as ProtocolError).detail;
}

function tempFiles(dir: string): string[] {
  return existsSync(dir) ? readdirSync(dir).filter((f) => f.startsWith('.')) : [];
}

/** A participant dir written by hand (as another implementation would), with a matching manifest. */
function handWritten(content: string | Buffer, manifest: Record<string, unknown> = {}, fileName?: string): string {
  const dir = dirOf();
  mkdirSync(dir, { recursive: true });
  const bytes = Buffer.isBuffer(content) ? content : Buffer.from(content);
  const digest = sha256(bytes);
  const name = fileName ?? `records-${digest}.jsonl`;
  writeFileSync(path.join(dir, name), bytes);
  const lines =
    bytes.length === 0
      ? 0
      : bytes
          .toString()
          .split('\n')
          .filter((l, i, a) => i < a.length - 1 || l !== '').length;
  writeFileSync(
    path.join(dir, MANIFEST_FILE),
    JSON.stringify({
      schema_version: 1,
      kind: KIND,
      instance: INSTANCE,
      checkpoint_id: 'ckpt-1',
      records_file: name,
      records_sha256: digest,
      record_count: lines,
      ...manifest,
    }),
  );
  return dir;
}

describe('writeRecords / readRecords', () => {
  it('round-trips records losslessly; re-writing what was read gives the same bytes', async () => {
    const records = sampleRecords();
    const manifest = await write(records, { extras: { session_owners: ['w1', 'w0'] } });
    const dir = dirOf();
    const file = path.join(dir, manifest.records_file);
    const bytes = readFileSync(file);
    expect(manifest).toEqual({
      session_owners: ['w1', 'w0'],
      schema_version: 1,
      kind: KIND,
      instance: INSTANCE,
      checkpoint_id: 'ckpt-1',
      records_file: `records-${sha256(bytes)}.jsonl`,
      records_sha256: sha256(bytes),
      record_count: 3,
    });
    expect(bytes.toString()).toBe(records.map((r) => `${stringifyLossless(r)}\n`).join(''));
    // The manifest as the reference writes it: sorted keys, one-space indent, no trailing newline.
    const text = readFileSync(path.join(dir, MANIFEST_FILE), 'utf8');
    expect(text.startsWith('{\n "checkpoint_id": "ckpt-1",\n "instance": "env_main",')).toBe(true);
    expect(text.endsWith('}')).toBe(true);
    expect(tempFiles(dir)).toEqual([]);

    const { manifest: m2, records: back } = await read();
    expect(m2).toEqual(manifest);
    expect(back.map((r) => stringifyLossless(r))).toEqual(records.map((r) => stringifyLossless(r)));
    expect((back[0]!.boundary as Record<string, unknown>).big).toBe(2n ** 70n);
    expect(back[1]!.boundary).toBeInstanceOf(OrderedObject);

    const again = await writeRecords({ checkpointDir: path.join(root, 'other'), kind: KIND, instance: INSTANCE, checkpointId: 'ckpt-2', records: back });
    expect(again.records_sha256).toBe(manifest.records_sha256);
    expect(readFileSync(path.join(dirOf(path.join(root, 'other')), again.records_file)).equals(bytes)).toBe(true);
  });

  it('streams an async iterable of many records across batch boundaries', async () => {
    const text = 'line "quoted"\n'.repeat(30_000); // ~420 KB per record
    async function* gen() {
      for (let i = 0; i < 40; i++) yield { episode_id: { rollout_id: `r${i}`, attempt: 0 }, state: { i, text } };
    }
    const manifest = await write(gen());
    expect(manifest.record_count).toBe(40);
    const { records } = await read();
    expect(records.map((r) => (r.state as { i: number }).i)).toEqual([...Array(40).keys()]);
    expect((records[39]!.state as { text: string }).text).toBe(text);
  });

  it('handles a single record larger than every buffer (20 MB, non-ASCII)', async () => {
    const huge = `${'données — "q"\n'.repeat(1_400_000)}end`;
    const manifest = await write([{ episode_id: { rollout_id: 'big', attempt: 0 }, huge }, ...sampleRecords()]);
    expect(manifest.record_count).toBe(4);
    const { records } = await read(new Set(['big']));
    expect(records).toHaveLength(1);
    expect(records[0]!.huge).toBe(huge);
  });

  it('writes zero records as an empty file named by the empty-string digest', async () => {
    const manifest = await write([]);
    expect(manifest.records_file).toBe(`records-${EMPTY_SHA}.jsonl`);
    expect(manifest.record_count).toBe(0);
    expect(readFileSync(path.join(dirOf(), manifest.records_file)).length).toBe(0);
    expect((await read()).records).toEqual([]);
  });

  it('keeps only in-scope records, normalizes a missing attempt and validates only kept records', async () => {
    handWritten(
      '{"episode_id": {"rollout_id": "a"}, "v": 1.0}\n{"episode_id": {"rollout_id": "b", "attempt": 2}, "v": NaN}\n{"episode_id": {"rollout_id": "c", "attempt": 0}, "bad": true}\n',
    );
    const seen: string[] = [];
    const { records } = await read(new Set(['a', 'b-a2']), (r) => {
      seen.push(r.episode_id.rollout_id);
      if ('bad' in r) throw new Error('bad record');
    });
    expect(records.map((r) => r.episode_id)).toEqual([
      { rollout_id: 'a', attempt: 0 },
      { rollout_id: 'b', attempt: 2 },
    ]);
    expect(seen).toEqual(['a', 'b']);
    expect((await read(null)).records).toHaveLength(3);
    expect((await read(new Set())).records).toEqual([]);
  });

  it('accepts the legacy records.jsonl name', async () => {
    handWritten('{"episode_id":{"rollout_id":"a","attempt":0}}\n', {}, 'records.jsonl');
    expect((await read()).records).toHaveLength(1);
  });

  it('the same write twice returns the existing manifest', async () => {
    const first = await write(sampleRecords());
    const second = await write(sampleRecords());
    expect(second).toEqual(first);
    expect(readdirSync(dirOf()).sort()).toEqual([first.records_file, MANIFEST_FILE].sort());
  });

  it('refuses a commit into a directory that holds a different commit, leaving it unchanged', async () => {
    const first = await write(sampleRecords());
    const before = readFileSync(path.join(dirOf(), MANIFEST_FILE), 'utf8');
    const detail = await refusal(write(sampleRecords().slice(1)));
    expect(detail).toMatch(/already holds a different commit/);
    expect(readFileSync(path.join(dirOf(), MANIFEST_FILE), 'utf8')).toBe(before);
    expect(readdirSync(dirOf()).sort()).toEqual([first.records_file, MANIFEST_FILE].sort());
    // Same records under another checkpoint ID: same records file, still a different commit.
    expect(await refusal(write(sampleRecords(), { checkpointId: 'ckpt-9' }))).toMatch(/different commit/);
    expect(readdirSync(dirOf()).sort()).toEqual([first.records_file, MANIFEST_FILE].sort());
    expect((await read()).records).toHaveLength(3);
  });

  it('stop() before publication: no manifest ever appears and the write fails', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    async function* gen() {
      yield sampleRecords()[0]!;
      await gate;
      yield sampleRecords()[1]!;
    }
    const w = startRecordsWrite({ checkpointDir: ckpt, kind: KIND, instance: INSTANCE, checkpointId: 'ckpt-1', records: gen() });
    await sleep(20);
    await w.stop();
    release();
    expect(await refusal(w.done)).toMatch(/resumed before its write finished/);
    await sleep(20);
    expect(existsSync(path.join(dirOf(), MANIFEST_FILE))).toBe(false);
    expect(readdirSync(dirOf())).toEqual([]);
  });

  it('stop() racing the end of a write: either published before, or never', async () => {
    for (let i = 0; i < 10; i++) {
      const dir = path.join(root, `race${i}`);
      const w = startRecordsWrite({ checkpointDir: dir, kind: KIND, instance: INSTANCE, checkpointId: 'c', records: sampleRecords() });
      await sleep(i);
      await w.stop();
      const published = existsSync(path.join(dirOf(dir), MANIFEST_FILE));
      const outcome = await w.done.then(
        () => 'published',
        (e: ProtocolError) => e.code,
      );
      expect(outcome).toBe(published ? 'published' : 'invalid_checkpoint_state');
      await sleep(5);
      expect(existsSync(path.join(dirOf(dir), MANIFEST_FILE))).toBe(published);
      expect(tempFiles(dirOf(dir))).toEqual([]);
    }
  });

  it('refuses a record that cannot be serialized, naming its episode', async () => {
    const bad = [...sampleRecords(), { episode_id: { rollout_id: 'task9-roll0', attempt: 3 }, state: { f: () => 1 } }];
    const detail = await refusal(write(bad));
    expect(detail).toMatch(/episode task9-roll0-a3/);
    expect(detail).toMatch(/function/);
    expect(readdirSync(dirOf())).toEqual([]);
    expect(await refusal(write([{ state: 1 }]))).toMatch(/no valid episode_id/);
    expect(readdirSync(dirOf())).toEqual([]);
  });

  it('writes at the same time and one after another, one failing in mid-record, each give exactly their own records (encoders and buffers are reused)', async () => {
    const recordsOf = (tag: string, n: number) =>
      Array.from({ length: n }, (_, i) => ({ episode_id: { rollout_id: `${tag}-${i}`, attempt: 0 }, state: { tag, i, text: `${tag} "é"\n`.repeat(3_000) } }));
    const fileBytes = async (instance: string) => {
      const dir = dirOf(ckpt, KIND, instance);
      const name = readdirSync(dir).find((f) => f.startsWith('records-'))!;
      return readFileSync(path.join(dir, name));
    };
    const expected = (records: object[]) => Buffer.from(records.map((r) => `${stringifyLossless(r)}\n`).join(''));
    const writeAs = (instance: string, records: object[]) => writeRecords({ checkpointDir: ckpt, kind: KIND, instance, checkpointId: 'ckpt-1', records });
    // Three at once, each over several batches (~40 MB in all).
    const batches = ['a', 'b', 'c'].map((tag) => recordsOf(tag, 600));
    await Promise.all(batches.map((records, k) => writeAs(`pool${k}`, records)));
    for (let k = 0; k < 3; k++) expect((await fileBytes(`pool${k}`)).equals(expected(batches[k]!))).toBe(true);
    // A record that fails after part of its line was encoded leaves nothing behind for the next write.
    const failing = [...recordsOf('d', 5), { episode_id: { rollout_id: 'd-bad', attempt: 0 }, state: { text: 'x'.repeat(1000), f: () => 1 } }];
    expect(await refusal(writeAs('pool3', failing))).toMatch(/episode d-bad/);
    const after = recordsOf('e', 700);
    await writeAs('pool4', after);
    expect((await fileBytes('pool4')).equals(expected(after))).toBe(true);
  });

  it('refuses unsafe kind or instance path components', async () => {
    for (const [kind, instance] of [
      ['../x', INSTANCE],
      [KIND, '.hidden'],
      [KIND, 'a/b'],
      ['', INSTANCE],
      [KIND, '..'],
    ]) {
      expect(await refusal(writeRecords({ checkpointDir: ckpt, kind: kind!, instance: instance!, checkpointId: 'c', records: [] }))).toMatch(
        /safe path component/,
      );
      expect(await refusal(readRecords({ checkpointDir: ckpt, kind: kind!, instance: instance!, scope: null }))).toMatch(/safe path component/);
      expect(() => participantDir(ckpt, kind!, instance!)).toThrow(ProtocolError);
    }
    expect(existsSync(ckpt)).toBe(false);
  });

  it('refuses a directory it cannot create, as a typed error', async () => {
    const file = path.join(root, 'a-file');
    writeFileSync(file, 'x');
    expect(await refusal(writeRecords({ checkpointDir: file, kind: KIND, instance: INSTANCE, checkpointId: 'c', records: sampleRecords() }))).toMatch(
      /ENOTDIR|EEXIST/,
    );
    expect(await refusal(readRecords({ checkpointDir: file, kind: KIND, instance: INSTANCE, scope: null }))).toMatch(/ENOTDIR|manifest/);
  });

  it('refuses manifest extras that are not JSON or that override core fields, before writing', async () => {
    expect(await refusal(write(sampleRecords(), { extras: { n: 1n } }))).toMatch(/extras/);
    expect(await refusal(write(sampleRecords(), { extras: { record_count: 1 } }))).toMatch(/record_count/);
    expect(existsSync(path.join(dirOf(), MANIFEST_FILE))).toBe(false);
  });
});

describe.each([
  ['eager', undefined],
  ['deferred', 'x'],
])('readRecords (%s) refuses every corrupt state (§9.7)', (_mode, field) => {
  const good = '{"episode_id":{"rollout_id":"a","attempt":0},"x":1}\n';
  beforeEach(() => {
    deferField = field;
  });
  afterEach(() => {
    deferField = undefined;
  });

  it('manifest missing', async () => {
    expect(await refusal(read())).toMatch(/no manifest\.json/);
    mkdirSync(dirOf(), { recursive: true });
    writeFileSync(path.join(dirOf(), `records-${sha256(good)}.jsonl`), good);
    expect(await refusal(read())).toMatch(/no manifest\.json/);
  });

  it('manifest not JSON / not an object', async () => {
    const dir = handWritten(good);
    writeFileSync(path.join(dir, MANIFEST_FILE), '{"schema_version": 1,');
    expect(await refusal(read())).toMatch(/not JSON/);
    writeFileSync(path.join(dir, MANIFEST_FILE), '[1, 2]');
    expect(await refusal(read())).toMatch(/not a JSON object/);
    writeFileSync(path.join(dir, MANIFEST_FILE), 'null');
    expect(await refusal(read())).toMatch(/not a JSON object/);
  });

  it.each([
    ['schema_version missing', { schema_version: undefined }, /schema_version/],
    ['schema_version 2', { schema_version: 2 }, /schema_version 2/],
    ['kind of another participant', { kind: 'agent' }, /kind "agent"/],
    ['instance of another participant', { instance: 'env_other' }, /instance "env_other"/],
    ['checkpoint_id not a string', { checkpoint_id: 7 }, /checkpoint_id/],
    ['records_file missing', { records_file: undefined }, /records_file is missing/],
    ['records_file not a string', { records_file: 3 }, /records_file is missing or not a string/],
    ['records_file outside the directory', { records_file: '../x' }, /not a records file name/],
    ['records_file with a path', { records_file: `sub/records-${'0'.repeat(64)}.jsonl` }, /not a records file name/],
    ['records_sha256 malformed', { records_sha256: 'ABC' }, /records_sha256/],
    ['record_count not an integer', { record_count: 1.5 }, /record_count/],
  ])('%s', async (_name, patch, message) => {
    handWritten(good, patch);
    expect(await refusal(read())).toMatch(message);
  });

  it('records file missing', async () => {
    const dir = handWritten(good);
    rmSync(path.join(dir, `records-${sha256(good)}.jsonl`));
    expect(await refusal(read())).toMatch(/is missing/);
  });

  it('digest mismatch', async () => {
    const dir = handWritten(good);
    writeFileSync(path.join(dir, `records-${sha256(good)}.jsonl`), good.replace('"x":1', '"x":2'));
    expect(await refusal(read())).toMatch(/does not match its digest/);
  });

  it('record count mismatch', async () => {
    handWritten(good, { record_count: 2 });
    expect(await refusal(read())).toMatch(/holds 1 records, manifest says 2/);
  });

  it('a line that is not JSON', async () => {
    handWritten(`${good}not json\n`);
    expect(await refusal(read())).toMatch(/line 2 .* is not JSON/);
    handWritten(`${good}\n${good}`, { record_count: 3 });
    expect(await refusal(read())).toMatch(/line 2 .* is not JSON/);
  });

  it('a line that is not UTF-8', async () => {
    handWritten(Buffer.concat([Buffer.from('{"episode_id":{"rollout_id":"a"},"t":"'), Buffer.from([0xc3, 0x28]), Buffer.from('"}\n')]));
    expect(await refusal(read())).toMatch(/UTF-8/);
  });

  it('a record without a valid episode_id', async () => {
    for (const line of [
      '{"x":1}',
      '[1]',
      '{"episode_id":"a"}',
      '{"episode_id":{"rollout_id":"x-a1"}}',
      '{"episode_id":{"rollout_id":"a","attempt":-1}}',
      '{"episode_id":{"rollout_id":"a","attempt":1.5}}',
      '{"episode_id":{"rollout_id":"a","extra":1}}',
    ]) {
      rmSync(ckpt, { recursive: true, force: true });
      handWritten(`${line}\n`);
      expect(await refusal(read()), line).toMatch(/line 1 .* has no valid episode_id/);
    }
  });

  it('an in-scope record that fails validation names its episode', async () => {
    handWritten('{"episode_id":{"rollout_id":"task1","attempt":4},"x":1}\n');
    const detail = await refusal(
      read(new Set(['task1-a4']), () => {
        throw new Error('x must be a string');
      }),
    );
    expect(detail).toMatch(/episode task1-a4/);
    expect(detail).toMatch(/x must be a string/);
    // Out of scope: never validated.
    expect(
      (
        await read(new Set(['other']), () => {
          throw new Error('no');
        })
      ).records,
    ).toEqual([]);
  });
});

describe('readRecords countOnly (snapshot validation)', () => {
  const count = () => readRecords({ checkpointDir: ckpt, kind: KIND, instance: INSTANCE, scope: new Set(), countOnly: true });

  it('checks digest and count without parsing or keeping a record; a last line without LF counts', async () => {
    await write(sampleRecords());
    const r = await count();
    expect(r.records).toEqual([]);
    expect(r.manifest.record_count).toBe(3);
    const line = '{"episode_id":{"rollout_id":"r1","attempt":0}}';
    handWritten(`${line}\n${line}`);
    expect((await count()).manifest.record_count).toBe(2);
    handWritten('');
    expect((await count()).manifest.record_count).toBe(0);
  });

  it('files of several 8 MB chunks, one after another and side by side: each counted right, a flipped byte refused (chunk memory is reused)', async () => {
    const big = (lines: number, pad: string): Buffer =>
      Buffer.from(Array.from({ length: lines }, (_, i) => `{"episode_id":{"rollout_id":"r${i}","attempt":0},"pad":"${pad}"}\n`).join(''));
    const a = big(24_000, 'a'.repeat(900)); // ~22 MB: three chunks, the last short
    const b = big(19_001, 'b'.repeat(1_000)); // ~20 MB, another length
    for (const [content, lines] of [
      [a, 24_000],
      [b, 19_001],
      [a, 24_000],
    ] as const) {
      handWritten(content);
      expect((await count()).manifest.record_count).toBe(lines);
    }
    const [x, y] = await Promise.all([count(), count()]);
    expect([x.manifest.record_count, y.manifest.record_count]).toEqual([24_000, 24_000]);
    const dir = handWritten(a);
    const flipped = Buffer.from(a);
    flipped[flipped.length - 100] = 'c'.charCodeAt(0);
    writeFileSync(path.join(dir, `records-${sha256(a)}.jsonl`), flipped);
    expect(await refusal(count())).toMatch(/does not match its digest/);
  }, 60_000);

  it('refuses a digest or count mismatch', async () => {
    const line = '{"episode_id":{"rollout_id":"r1","attempt":0}}\n';
    const dir = handWritten(line);
    writeFileSync(path.join(dir, `records-${sha256(line)}.jsonl`), line.replace('r1', 'r2'));
    expect(await refusal(count())).toMatch(/does not match its digest/);
    handWritten(line, { record_count: 2 });
    expect(await refusal(count())).toMatch(/holds 1 records, manifest says 2/);
  });
});

describe('readRecords with a deferred field', () => {
  const deferred = (scope: ReadonlySet<string> | null = null, validate?: (r: CheckpointRecord) => unknown) =>
    readRecords({ checkpointDir: ckpt, kind: KIND, instance: INSTANCE, scope, validate, defer: 'boundary', deferMinBytes: 0 });
  const plain = (records: CheckpointRecord[]) => records.map((r) => stringifyLossless({ ...r, boundary: materialized(r.boundary) }));

  it("gives the eager read's records, the field unparsed until read; lines native JSON would misread are parsed eagerly", async () => {
    const records = [
      ...sampleRecords(),
      { episode_id: { rollout_id: 'task4-roll0', attempt: 0 }, task_digest: 'd'.repeat(64), boundary: { text: 'é東😀\n"q"', n: [1, 2.5, -0.25] } },
    ];
    await write(records);
    const eager = await read();
    const seen: unknown[] = [];
    const lazy = await deferred(null, (r) => seen.push(r.boundary));
    const pending = lazy.records.map((r) => (r.boundary instanceof DeferredJson ? r.boundary.pendingBytes : 0));
    expect(pending[3]).toBeGreaterThan(0);
    expect(plain(lazy.records)).toEqual(plain(eager.records));
    // big integer / -Infinity / 1.0 and an out-of-order index key: parsed here, not deferred
    expect(lazy.records[0]!.boundary).not.toBeInstanceOf(DeferredJson);
    expect(lazy.records[1]!.boundary).toBeInstanceOf(OrderedObject);
    // validate sees the deferred value; null and objects are deferred alike
    expect(seen[2]).toBeInstanceOf(DeferredJson);
    const d = lazy.records[3]!.boundary as DeferredJson;
    expect(d).toBeInstanceOf(DeferredJson);
    expect(d.value()).toEqual({ text: 'é東😀\n"q"', n: [1, 2.5, -0.25] });
    expect(d.pendingBytes).toBe(0);
    expect(materialized(lazy.records[2]!.boundary)).toBeNull();
    // written back as its value, by either writer
    expect(JSON.parse(JSON.stringify(lazy.records[3]))).toEqual(JSON.parse(JSON.stringify(eager.records[3])));
    const again = await writeRecords({
      checkpointDir: path.join(root, 'again'),
      kind: KIND,
      instance: INSTANCE,
      checkpointId: 'ckpt-1',
      records: lazy.records,
    });
    expect(again.records_sha256).not.toBe(''); // key order of a deferred record: the field last
  });

  it('reads a file split across workers in file order: scope, line numbers and errors as the eager read', async () => {
    const text = 'données — "q" '.repeat(5_000); // ~75 KB per record, non-ASCII
    const records = Array.from({ length: 400 }, (_, i) => ({ episode_id: { rollout_id: `r${i}`, attempt: 1 }, boundary: { i, text } }));
    await write(records); // ~30 MB: more than one range
    const scope = new Set(records.filter((_, i) => i % 3 === 0).map((r) => `${r.episode_id.rollout_id}-a1`));
    const lazy = await deferred(scope);
    expect(lazy.records.every((r) => r.boundary instanceof DeferredJson)).toBe(true);
    expect(lazy.records.map((r) => (materialized(r.boundary) as { i: number }).i)).toEqual(records.map((_, i) => i).filter((i) => i % 3 === 0));
    expect((materialized(lazy.records[10]!.boundary) as { text: string }).text).toBe(text);
    const all = await deferred(null);
    expect(all.records).toHaveLength(400);

    // A bad line late in the file (in the last range) is named by its file-wide number.
    const dir = dirOf();
    const file = path.join(dir, readdirSync(dir).find((f) => f.startsWith('records-'))!);
    const bytes = readFileSync(file);
    const lines = bytes.toString().split('\n');
    lines[390] = '{"episode_id":{"rollout_id":"r390","attempt":1},"boundary":oops}';
    const broken = Buffer.from(lines.join('\n'));
    rmSync(ckpt, { recursive: true, force: true });
    handWritten(broken);
    expect(await refusal(deferred())).toMatch(/line 391 .* is not JSON/);
  });
});

describe('NG_RECORDS_DEFER_MIN_BYTES', () => {
  it('sets the size from which a deferred read uses the workers; a bad value is an error naming it', () => {
    const saved = process.env.NG_RECORDS_DEFER_MIN_BYTES;
    try {
      delete process.env.NG_RECORDS_DEFER_MIN_BYTES;
      expect(deferMinBytes()).toBe(16 * 1024 * 1024);
      process.env.NG_RECORDS_DEFER_MIN_BYTES = '0';
      expect(deferMinBytes()).toBe(0);
      for (const bad of ['-1', '1.5', '16MB', 'x']) {
        process.env.NG_RECORDS_DEFER_MIN_BYTES = bad;
        expect(() => deferMinBytes()).toThrow(/NG_RECORDS_DEFER_MIN_BYTES/);
      }
    } finally {
      if (saved === undefined) delete process.env.NG_RECORDS_DEFER_MIN_BYTES;
      else process.env.NG_RECORDS_DEFER_MIN_BYTES = saved;
    }
  });
});
