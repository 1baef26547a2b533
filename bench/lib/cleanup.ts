// Processes a benchmark starts (a Temporal dev server, a Gym deployment) must not outlive it when
// it is interrupted (Ctrl-C, SIGTERM from `npm run bench`, a timeout) or fails: each start
// registers its stop here, and the stops run in reverse order on the way out.
type Stop = () => Promise<unknown> | unknown;

const stops: Array<{ name: string; stop: Stop }> = [];
let installed = false;

async function runStops(): Promise<void> {
  while (stops.length > 0) {
    const { name, stop } = stops.pop()!;
    try {
      await stop();
    } catch (err) {
      console.error(`bench cleanup: stopping ${name} failed: ${(err as Error)?.message ?? String(err)}`);
    }
  }
}

/** Registers `stop`; returns a function that runs it now (once) and unregisters it. */
export function onExit(name: string, stop: Stop): () => Promise<void> {
  if (!installed) {
    installed = true;
    for (const signal of ['SIGINT', 'SIGTERM'] as const) {
      process.once(signal, () => {
        console.error(`bench: ${signal}, stopping what it started …`);
        void runStops().finally(() => process.exit(130));
      });
    }
    process.once('uncaughtException', (err) => {
      console.error(err);
      void runStops().finally(() => process.exit(1));
    });
    process.once('unhandledRejection', (err) => {
      console.error(err);
      void runStops().finally(() => process.exit(1));
    });
  }
  const entry = { name, stop };
  stops.push(entry);
  let done = false;
  return async () => {
    if (done) return;
    done = true;
    const i = stops.indexOf(entry);
    if (i >= 0) stops.splice(i, 1);
    await stop();
  };
}
