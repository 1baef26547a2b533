// `npm run gym -- <command>`: runs a Gym deployment as detached process groups.
//   up <config.yaml> --dir <run dir>   validate, pick ports, start everything, wait for /healthz
//   down <run dir>                     SIGTERM every server, SIGKILL stragglers
//   kill <run dir> [--all] [--server NAME]...   SIGKILL every Gym server (a crash); --all also the
//                                               inference backend; --server only the named ones
//   restart <run dir> [--server NAME]...        fresh Gym servers on the same ports (inference only if
//                                               it is down); --server only the named ones
//   status <run dir>                   alive / healthy per server
import { parseArgs } from 'node:util';
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

const USAGE = `usage: npm run gym -- up <config.yaml> --dir <run dir>
       npm run gym -- down <run dir>
       npm run gym -- kill <run dir> [--all] [--server NAME]...
       npm run gym -- restart <run dir> [--server NAME]...
       npm run gym -- status <run dir>`;

class UsageError extends Error {}

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
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        dir: { type: 'string' },
        all: { type: 'boolean', default: false },
        server: { type: 'string', multiple: true },
        help: { type: 'boolean', short: 'h' },
      },
    });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const { values, positionals } = parsed;
  const [command, arg] = positionals;
  if (values.help || !command) {
    console.log(USAGE);
    return values.help ? 0 : 2;
  }
  const progress = (line: string): void => console.error(`gym: ${line}`);
  const need = (what: string): string => {
    if (!arg || positionals.length > 2) throw new UsageError(`${command} needs exactly one argument: ${what}`);
    return arg;
  };
  switch (command) {
    case 'up': {
      const config = need('<config.yaml>');
      if (!values.dir) throw new UsageError('up needs --dir <run dir>');
      printServers(await upDeployment({ config, runDir: values.dir, log: progress }));
      return 0;
    }
    case 'down':
      await downDeployment(need('<run dir>'));
      console.log('stopped');
      return 0;
    case 'kill': {
      if (values.all && values.server) throw new UsageError('kill takes --all or --server, not both');
      const killed = await killDeployment(need('<run dir>'), { includeInference: values.all, ...(values.server ? { servers: values.server } : {}) });
      console.log(killed.length ? `SIGKILLed ${killed.join(', ')}` : 'nothing was running');
      return 0;
    }
    case 'restart':
      printServers(await restartDeployment(need('<run dir>'), { log: progress, ...(values.server ? { servers: values.server } : {}) }));
      return 0;
    case 'status': {
      const rows = (await statusDeployment(need('<run dir>'))).map((s) => [
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
      throw new UsageError(`unknown command '${command}'`);
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    if (err instanceof UsageError) console.error(`${err.message}\n${USAGE}`);
    else if (err instanceof ConfigError) console.error(`config error: ${err.message}`);
    else if (err instanceof LaunchError) console.error(`gym: ${err.message}`);
    else console.error(`gym: ${err instanceof Error ? err.message : String(err)}`);
    process.exit(err instanceof UsageError || err instanceof ConfigError ? 2 : 1);
  },
);
