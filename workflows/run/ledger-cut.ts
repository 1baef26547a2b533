// The run's side of a checkpoint attempt's ledger cut: the ledger as it stands, written into the
// temp snapshot while Gym commits (asked once Gym is prepared), and written again after the commit
// only if an episode Gym did not commit was still in flight when it was written.
import { condition, isCancellation, type ChildWorkflowHandle } from '@temporalio/workflow';
import type { CheckpointOutcome } from '../../protocol/controller.js';
import type { CaptureKey } from '../../protocol/episode-id.js';
import { packJson } from '../../protocol/packed-json.js';
import type { checkpointAttempt } from '../checkpointAttempt.js';
import { earlyLedgerCutWritten, ledgerCutWritten, type LedgerCutWritten } from '../messages.js';
import type { RunContext } from './context.js';
import { takeReports } from './stops.js';

interface Cut {
  cut: LedgerCutWritten;
  /** The attempts in flight when it was written. */
  inFlight: Set<CaptureKey>;
}

/** Writes the ledger as it stands into the temp snapshot (a local activity: it stays out of the history). */
async function writeCut(ctx: RunContext, checkpointId: string, tmpDir: string): Promise<Cut> {
  const { st } = ctx;
  takeReports(ctx);
  const inFlight = new Set(Object.keys(st.inFlight));
  const cutOf = { dataloaderCursor: st.ledger.cursor, baseTrainStep: st.steps, trainerVersion: st.trainerVersion };
  const cut = await ctx.storageLocal.writeLedgerCut({ tmpDir, ledger: packJson(st.ledger) });
  return { cut: { checkpointId, sha256: cut.sha256, bytes: cut.bytes, ...cutOf }, inFlight };
}

/**
 * Answers the attempt's requests for the ledger cut until it ends; its outcome. `atStart`: the
 * attempts in flight when it started (the scope candidates).
 */
export async function answerLedgerCut(
  ctx: RunContext,
  handle: ChildWorkflowHandle<typeof checkpointAttempt>,
  checkpointId: string,
  atStart: ReadonlySet<CaptureKey>,
): Promise<CheckpointOutcome> {
  const { st, cfg } = ctx;
  let outcome: CheckpointOutcome | undefined;
  const result = handle.result().then((o) => (outcome = o));
  const committed = (): boolean => ctx.cutRequest?.checkpointId === checkpointId;
  const prepared = (): boolean => ctx.earlyCutRequest?.checkpointId === checkpointId;
  let early: Cut | undefined;
  let earlySent = false;
  await condition(() => outcome !== undefined || committed() || prepared());
  if (outcome === undefined && !committed() && prepared()) {
    const req = ctx.earlyCutRequest!;
    ctx.earlyCutRequest = undefined;
    // Best effort: a commit that failed meanwhile has the attempt discard the temp snapshot
    // (the write is then refused); after a commit the cut is written again if this one is missing.
    early = await writeCut(ctx, checkpointId, req.tmpDir).catch((err: unknown) => {
      if (isCancellation(err)) throw err; // the run is being cancelled: not a refused write
      return undefined;
    });
    // The attempt publishes with it at once if Gym committed every episode in flight.
    if (early) {
      void handle.signal(earlyLedgerCutWritten, early.cut).catch(() => undefined);
      earlySent = true;
    }
    await condition(() => outcome !== undefined || committed());
  }
  if (outcome === undefined && committed()) {
    const req = ctx.cutRequest!;
    ctx.cutRequest = undefined;
    // Episodes neither continued nor restarts finished before the cut: their /run replies are on
    // the wire. Wait briefly so the cut holds their results (an attempt that never reached Gym
    // simply reruns from its input after a cold restore). Dispatch is closed, so nothing joined
    // st.inFlight since the start; anything that did counts as unsettled.
    const unsettled = new Set(req.unsettled);
    let cut = early?.cut;
    let rewritten = false;
    if (!early || [...unsettled].some((k) => early!.inFlight.has(k))) {
      await condition(
        () => Object.keys(st.inFlight).every((k) => atStart.has(k) && !unsettled.has(k)) && st.reports.length === 0,
        cfg.controller.late_result_wait_ms,
      );
      cut = (await writeCut(ctx, checkpointId, req.tmpDir)).cut;
      rewritten = true;
    }
    // The attempt publishes with the early cut the run sent it: no confirmation (none to reach it
    // as it completes). Decided by what the history holds (the signal's field).
    const unconfirmed = earlySent && !rewritten && req.takesEarlyCut === true;
    // The attempt may already have published with the early cut and ended: nobody to tell.
    if (!unconfirmed) await handle.signal(ledgerCutWritten, cut!).catch(() => undefined);
  }
  await result;
  return outcome!;
}
