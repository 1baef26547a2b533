// Checkpoint overhead of the policy model participant (participants.md §5) at scale.
//
//   npx tsx bench/model.ts [--inflight 8000] [--import 16000] [--repeat 1]
//
// Case "inflight": N episodes, each with its first model call delivered (ledger row + staged
// tokens) and its second call admitted and in flight. Prepare (the calls do not hold it up), then
// the backend's replies arrive while Gym is prepared and are held (N held responses), commit with
// the N episodes in scope, resume (every held reply is delivered and recorded); then a fresh
// participant over the same capture directory restores the checkpoint (ledger import under N+1).
// Case "import": restore of M episodes with two rows each into a fresh participant whose capture
// directory holds what a dead execution left (ledgers and staged tokens of attempt 0): the ledger
// import NeMo Gym reports 1.5 s for at 15,686 episodes.
//
// A restore replies once the imported rows are live in memory and journaled in one file; the
// per-key ledger files are written (and the retired attempts' files deleted) after the reply.
// Both are reported: "restore (reply)" is what the controller waits for.
//
// The participant is driven in-process through its gate (the calls a proxy would make), and the
// control plane directly: this measures the participant and its files, not HTTP.
import { captureKey, type EpisodeId } from '../protocol/ids.js';
import type { ChatMessage } from '../protocol/openai.js';
import { decide, initialWeights } from '../servers/inference/policy.js';
import { completionBody, fakeTokenIds, promptTextOf } from '../servers/inference/reply.js';
import type { AdmittedCall } from '../servers/model/gate.js';
import type { ModelParticipant } from '../servers/model/participant.js';
import { deadline, forEachLimit, importCase, m0, newParticipant, removeTempDirs, settleDisk, tempDir, timed } from './lib/model-participant.js';
import { printTable, round3, writeBenchResult, type Row } from './lib/results.js';

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const v = Number(process.argv[i + 1]);
  if (!Number.isFinite(v) || v < 0) throw new Error(`--${name} needs a non-negative number`);
  return Math.floor(v);
}

const INFLIGHT = arg('inflight', 8000);
const IMPORT = arg('import', 16000);
const REPEAT = Math.max(1, arg('repeat', 1));

const never = new AbortController().signal;

// --- realistic calls: a counter episode, its first and second model call ------------------------

const weights = initialWeights();
const tools = [
  { type: 'function', function: { name: 'increment_counter', parameters: { type: 'object', properties: { count: { type: 'integer' } } } } },
  { type: 'function', function: { name: 'get_counter_value', parameters: { type: 'object', properties: {} } } },
];

function replyFor(rolloutId: string, messages: ChatMessage[]): Record<string, any> {
  const d = decide({ weights, messages, rolloutId });
  return completionBody(d, {
    id: `chatcmpl-${d.seedHex.slice(0, 24)}`,
    created: 0,
    model: 'policy',
    promptTokenIds: fakeTokenIds(promptTextOf(messages)),
  }) as never;
}

function secondTurn(rolloutId: string, first: Record<string, any>): ChatMessage[] {
  const msg = first.choices[0].message as ChatMessage;
  const call = msg.tool_calls?.[0];
  return call
    ? [...m0, { role: 'assistant', content: null, tool_calls: msg.tool_calls }, { role: 'tool', tool_call_id: call.id, content: '{"count":2}' }]
    : [...m0, { role: 'assistant', content: msg.content }, { role: 'user', content: `continue ${rolloutId}` }];
}

async function call(p: ModelParticipant, key: string, e: EpisodeId, messages: ChatMessage[]): Promise<AdmittedCall> {
  return p.admit({ key, episode: e, route: '/v1/chat/completions', body: { model: 'policy', messages, tools }, signal: never });
}

// --- case: in-flight calls --------------------------------------------------------------------------

async function inflightCase(n: number): Promise<Record<string, number>> {
  const captureDir = tempDir('bench-model-capture-');
  const ckptDir = tempDir('bench-model-ckpt-');
  const { participant, plane } = await newParticipant(captureDir);
  const episodes = Array.from({ length: n }, (_, i) => ({ rollout_id: `b-${i}`, attempt: 0 }));

  const [, firstCalls] = await timed(() =>
    forEachLimit(episodes, 64, async (e) => {
      const key = captureKey(e);
      const c = await call(participant, key, e, m0);
      const body = replyFor(e.rollout_id, m0);
      await c.deliver({ status: 200, stream: false, body });
      await c.complete({
        responseId: null,
        weightVersion: 0,
        promptTokenIds: null,
        completionTokenIds: null,
        completionLogprobs: null,
        finishReason: null,
        complete: true,
      });
      c.end();
    }),
  );
  // Second calls: admitted, in flight at the backend.
  const second = await Promise.all(
    episodes.map(async (e) => {
      const first = replyFor(e.rollout_id, m0);
      const messages = secondTurn(e.rollout_id, first);
      return { e, messages, admitted: await call(participant, captureKey(e), e, messages) };
    }),
  );

  settleDisk();
  const [prep, prepareS] = await timed(() => plane.prepare({ checkpoint_id: 'bench-1', deadline_ts: deadline() }));
  if (prep.phase !== 'prepared') throw new Error(`prepare did not prepare: ${JSON.stringify(prep.report)}`);
  // The backend answers while Gym is prepared: every reply is held.
  const deliveries = second.map((s) => {
    const d = s.admitted.deliver({ status: 200, stream: false, body: replyFor(s.e.rollout_id, s.messages) }).then(() => s.admitted.end());
    return d;
  });
  await new Promise((r) => setImmediate(r));
  const held = participant.held;
  const [commitReply, commitS] = await timed(() =>
    plane.commit({ checkpoint_id: 'bench-1', deadline_ts: deadline(), checkpoint_dir: ckptDir, episode_ids: episodes, stop: false }),
  );
  const [, resumeS] = await timed(async () => {
    await plane.resume({ checkpoint_id: 'bench-1', deadline_ts: deadline() });
    await Promise.all(deliveries);
  });
  plane.close();

  // A fresh participant (a restarted process) restores the checkpoint.
  const fresh = await newParticipant(captureDir);
  settleDisk();
  const [restored, restoreS] = await timed(() =>
    fresh.plane.restore({ checkpoint_id: 'bench-restore-1', deadline_ts: deadline(), checkpoint_dir: ckptDir, episode_ids: episodes }),
  );
  // After the reply: the per-key ledger files and the retired attempts' deletions.
  const [, settleS] = await timed(() => fresh.participant.settled());
  fresh.plane.close();
  if (restored.restored.length !== n) throw new Error(`restored ${restored.restored.length} of ${n}`);
  return {
    episodes: n,
    inflight_at_prepare: prep.report.counts.inflight ?? 0,
    held,
    first_calls_s: firstCalls,
    prepare_s: prepareS,
    commit_s: commitS,
    staging_keys: (commitReply as { staging_keys?: unknown[] }).staging_keys?.length ?? 0,
    resume_and_deliver_s: resumeS,
    restore_s: restoreS,
    restore_background_s: settleS,
  };
}

// --- main -------------------------------------------------------------------------------------------

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main(): Promise<void> {
  const rows: Row[] = [];
  const runs: Array<Record<string, number>> = [];
  const imports: Array<Record<string, number>> = [];
  for (let r = 0; r < REPEAT; r++) {
    if (INFLIGHT > 0) runs.push(await inflightCase(INFLIGHT));
    if (IMPORT > 0) imports.push(await importCase(IMPORT));
  }
  if (runs.length) {
    const pick = (k: string): number => round3(median(runs.map((x) => x[k]!)));
    rows.push(
      { case: 'inflight', step: 'first calls (setup)', episodes: INFLIGHT, seconds: pick('first_calls_s') },
      { case: 'inflight', step: 'prepare', episodes: INFLIGHT, inflight: runs[0]!.inflight_at_prepare!, seconds: pick('prepare_s') },
      { case: 'inflight', step: 'commit', episodes: INFLIGHT, held: runs[0]!.held!, seconds: pick('commit_s') },
      { case: 'inflight', step: 'resume + deliver held', episodes: INFLIGHT, seconds: pick('resume_and_deliver_s') },
      { case: 'inflight', step: 'restore (reply)', episodes: INFLIGHT, seconds: pick('restore_s') },
      { case: 'inflight', step: 'restore (files, after reply)', episodes: INFLIGHT, seconds: pick('restore_background_s') },
    );
  }
  if (imports.length) {
    rows.push(
      { case: 'import', step: 'ledger import (restore reply)', episodes: IMPORT, rows: 2 * IMPORT, seconds: round3(median(imports.map((x) => x.import_s!))) },
      {
        case: 'import',
        step: 'ledger files (after reply)',
        episodes: IMPORT,
        rows: 2 * IMPORT,
        seconds: round3(median(imports.map((x) => x.import_background_s!))),
      },
    );
  }
  printTable(rows);
  const fig = (k: string, src: Array<Record<string, number>>): number | null => (src.length ? round3(median(src.map((x) => x[k]!))) : null);
  const file = writeBenchResult(
    'model',
    {
      inflight_episodes: INFLIGHT,
      prepare_s: fig('prepare_s', runs),
      commit_s: fig('commit_s', runs),
      resume_and_deliver_s: fig('resume_and_deliver_s', runs),
      restore_s: fig('restore_s', runs),
      restore_background_s: fig('restore_background_s', runs),
      import_episodes: IMPORT,
      import_s: fig('import_s', imports),
      import_background_s: fig('import_background_s', imports),
      repeat: REPEAT,
    },
    rows,
  );
  console.log(`\nwrote ${file}`);
}

main()
  .catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  })
  .finally(() => {
    removeTempDirs();
  });
