// `npm run gym -- <verb>`: runs a Gym deployment as detached process groups (up, down, kill,
// restart, status); `--help` lists the verbs, options and environment (GYM_CLI).
import { ConfigError } from '../servers/common/config-error.js';
import {
  downDeployment,
  killDeployment,
  LaunchError,
  restartDeployment,
  statusDeployment,
  upDeployment,
  type RunningDeployment,
} from '../servers/launcher/launcher.js';
import { defineCommand, exitWithUsageError, parseCommandLine } from './cli.mjs';

const GYM_CLI = defineCommand({
  name: 'gym',
  invocation: 'npm run gym',
  usage: [
    'npm run gym -- up <config.yaml> --dir <run dir>',
    'npm run gym -- down <run dir>',
    'npm run gym -- kill <run dir> [--all] [--server NAME]...',
    'npm run gym -- restart <run dir> [--server NAME]...',
    'npm run gym -- status <run dir>',
  ],
  summary:
    'Runs a Gym deployment (a YAML file of servers, docs/gym-servers.md, e.g. examples/gym.yaml) as detached process groups that outlive this command; ' +
    'the run directory keeps endpoints.json, state.json and logs/.',
  verbs: [
    { name: 'up', args: '<config.yaml>', help: 'validate the deployment, pick ports, start every server and wait for /healthz (needs --dir)' },
    { name: 'down', args: '<run dir>', help: 'SIGTERM every server, SIGKILL stragglers' },
    { name: 'kill', args: '<run dir>', help: 'SIGKILL every Gym server (a crash); the inference backend survives unless --all; --server only the named ones' },
    {
      name: 'restart',
      args: '<run dir>',
      help: 'fresh Gym servers on the same ports (the inference backend only if it is down); --server only the named ones',
    },
    { name: 'status', args: '<run dir>', help: 'alive / healthy per server' },
  ],
  flags: {
    dir: { type: 'string', value: 'DIR', help: 'up: the run directory to create' },
    all: { type: 'boolean', help: 'kill: the inference backend too' },
    server: { type: 'string', value: 'NAME', multiple: true, help: 'kill, restart: only this server (repeat for more)' },
  },
  env: [
    {
      name: 'GYM_CONTROL_TOKEN',
      help: 'up, restart: the checkpoint control token, when the config sets no checkpoint.control_auth_token (required with checkpoint.enabled); passed to every server',
    },
    { name: 'GYM_SESSION_SECRET', help: 'signs session cookies when the config sets no session_secret (else a dev default)' },
    { name: 'LOG_LEVEL', help: "the servers' log level (default: info)" },
    {
      name: 'NG_RECORDS_DEFER_MIN_BYTES',
      help: 'resources servers: checkpoint records files from this size on are parsed off the main thread (default: 16 MiB)',
    },
    {
      name: 'OTEL_EXPORTER_OTLP_ENDPOINT',
      help: "an OTLP/HTTP collector (e.g. http://127.0.0.1:4318): every server sends a span per control call and /run, joined to the caller's trace (off when unset)",
    },
    { name: '<options.api_key_env>', help: "a model server's backend API key, in the variable its options.api_key_env names (e.g. LLAMA_API_KEY)" },
  ],
  notes: ['Every server gets this environment. Exit status: 0 done; 1 a launch failed; 2 a usage or deployment config error.'],
});

function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows
    .map((r) =>
      r
        .map((c, i) => c.padEnd(widths[i]!))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

function printServers(d: RunningDeployment): void {
  const rows = Object.entries(d.endpoints).map(([name, e]) => [name, e.kind, e.url]);
  console.log(table([['name', 'kind', 'url'], ...rows]));
  console.log(`run dir: ${d.runDir} (endpoints.json, state.json, logs/)`);
}

async function main(argv: string[]): Promise<number> {
  const { values, verb: command, args } = parseCommandLine(GYM_CLI, argv);
  const arg = args[0]!;
  const progress = (line: string): void => console.error(`gym: ${line}`);
  switch (command) {
    case 'up': {
      if (!values.dir) exitWithUsageError(GYM_CLI, 'up needs --dir <run dir>');
      printServers(await upDeployment({ config: arg, runDir: values.dir, log: progress }));
      return 0;
    }
    case 'down':
      await downDeployment(arg);
      console.log('stopped');
      return 0;
    case 'kill': {
      if (values.all && values.server) exitWithUsageError(GYM_CLI, 'kill takes --all or --server, not both');
      const killed = await killDeployment(arg, { includeInference: values.all ?? false, ...(values.server ? { servers: values.server } : {}) });
      console.log(killed.length ? `SIGKILLed ${killed.join(', ')}` : 'nothing was running');
      return 0;
    }
    case 'restart':
      printServers(await restartDeployment(arg, { log: progress, ...(values.server ? { servers: values.server } : {}) }));
      return 0;
    case 'status': {
      const rows = (await statusDeployment(arg)).map((s) => [
        s.name,
        s.kind,
        s.url,
        String(s.pid ?? '-'),
        s.alive ? 'alive' : 'dead',
        s.healthy ? 'healthy' : '-',
      ]);
      console.log(table([['name', 'kind', 'url', 'pid', 'process', 'health'], ...rows]));
      return 0;
    }
    default:
      return 2; // parseCommandLine accepts only the verbs above
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    if (err instanceof ConfigError) console.error(`config error: ${err.message}`);
    else if (err instanceof LaunchError) console.error(`gym: ${err.message}`);
    else console.error(`gym: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(err instanceof ConfigError ? 2 : 1);
  },
);
