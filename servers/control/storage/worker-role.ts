// Whether this process is one worker of a multi-worker server (docs/multi-worker.md), and which.
// Its records are then a part: held in memory by the commit (held-part.ts) until the front has it
// written at its offset of the participant's one records file, which the front makes durable, and
// read back from that file's part of this worker only (the manifest's `worker_parts`, reader.ts).
let role: WorkerRole | undefined;

export interface WorkerRole {
  index: number;
  /** The number of workers of the server. */
  of: number;
}

/** Set once by a worker process at start (undefined: a whole server again, as tests need). */
export function setWorkerRole(worker: WorkerRole | undefined): void {
  role = worker;
}

export function workerRole(): WorkerRole | undefined {
  return role;
}
