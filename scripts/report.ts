// `npm run report -- <run>` (`--help`: REPORT_CLI): one self-contained HTML page of a training run
// (reward per step, checkpoint admission-closed and stage seconds, rollouts continued vs restarted
// per recovery, dispatch and completion over time), from its Temporal histories and its
// checkpoint_metrics.jsonl. scripts/report/: data.ts (pure), html.ts (the page), fetch.ts (I/O).
import { pathToFileURL } from 'node:url';
import { defineCommand, exitWithUsageError, parseCommandLine } from './cli.mjs';
import { projectRoot } from './temporal-paths.mjs';
import { CONNECTION_ENV, CONNECTION_FLAGS, connectWithin, targetOf } from './temporal-connect.js';

export const REPORT_CLI = defineCommand({
  name: 'report',
  invocation: 'npm run report',
  usage: ['npm run report -- <run> [--out FILE] [--checkpoint-dir DIR] [--address HOST:PORT] [--namespace NS] [--connect-timeout-s N]'],
  summary:
    'Writes a report of a training run (finished or not) as one self-contained HTML file that opens offline: reward per step, admission-closed and stage ' +
    'seconds per checkpoint, rollouts continued vs restarted per recovery, rollouts dispatched and completed over time, and tables of the checkpoints ' +
    "and recoveries. Built from the run's Temporal history (every continue-as-new), its rollout shards' histories, its result (or status query) and " +
    "<checkpoint_dir>/checkpoint_metrics.jsonl. Prints the file's path.",
  flags: {
    out: { type: 'string', short: 'o', value: 'FILE', help: 'where to write the page (default: .data/reports/<run>.html in the project)' },
    'checkpoint-dir': {
      type: 'string',
      value: 'DIR',
      help: "where the run's checkpoint_metrics.jsonl is (default: the run config's run.checkpoint_dir, relative to the current directory)",
    },
    ...CONNECTION_FLAGS,
  },
  env: [CONNECTION_ENV],
  notes: [
    'A run without a result (running, failed) takes its steps and rewards from the status query, which needs a worker; without one, from the state its newest continue-as-new carried.',
    'Exit status: 0 written; 1 the report could not be made (Temporal unreachable, no such run); 2 a usage error.',
  ],
});

/**
 * The run's name taken out of argv, the rest for parseCommandLine (which takes positional
 * arguments only after a verb, and this command has none). A flag's value stays with its flag.
 */
function splitPositionals(argv: readonly string[]): { rest: string[]; positionals: string[] } {
  const takesValue = new Set(
    Object.entries(REPORT_CLI.flags).flatMap(([name, f]) => (f.type === 'string' ? [`--${name}`, ...('short' in f && f.short ? [`-${f.short}`] : [])] : [])),
  );
  const rest: string[] = [];
  const positionals: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (takesValue.has(a)) rest.push(a, ...(i + 1 < argv.length ? [argv[++i]!] : []));
    else if (a.startsWith('-') && a !== '-') rest.push(a);
    else positionals.push(a);
  }
  return { rest, positionals };
}

async function main(argv: string[]): Promise<void> {
  const { rest, positionals } = splitPositionals(argv);
  const { values } = parseCommandLine(REPORT_CLI, rest);
  if (positionals.length !== 1) exitWithUsageError(REPORT_CLI, positionals.length ? 'takes exactly one <run>' : 'which run? give its name (workflow ID)');
  const run = positionals[0]!;
  const timeoutS = values['connect-timeout-s'] === undefined ? 2 : Number(values['connect-timeout-s']);
  if (!(timeoutS > 0)) exitWithUsageError(REPORT_CLI, '--connect-timeout-s must be a positive number of seconds');
  // Loaded once the arguments are good: --help and usage errors answer without the Temporal client.
  const [{ Client, NamespaceNotFoundError }, { defaultReportFile, ReportFailure, writeRunReport }] = await Promise.all([
    import('@temporalio/client'),
    import('./report/fetch.js'),
  ]);
  const target = targetOf(values.address, process.env);
  const namespace = values.namespace ?? 'default';
  const connection = await connectWithin(target, timeoutS * 1000);
  try {
    const client = new Client({ connection, namespace });
    const { file } = await writeRunReport(client, run, {
      out: values.out ?? defaultReportFile(projectRoot, run),
      ...(values['checkpoint-dir'] ? { checkpointDir: values['checkpoint-dir'] } : {}),
    }).catch((err: unknown) => {
      if (err instanceof NamespaceNotFoundError)
        throw new ReportFailure(`no namespace ${namespace} on the Temporal server at ${target.address} (${target.source})`);
      throw err;
    });
    console.log(file);
  } finally {
    await connection.close();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    // Our failures are sentences (ConnectFailure, ReportFailure); anything else is said in one line too.
    console.error(`report: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(1);
  });
}
