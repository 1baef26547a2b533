// `npm run report` explains itself like every other command (scripts/cli.mjs): --help lists its
// options and the environment it reads; a usage error exits 2; with no Temporal server at the
// address it fails within seconds naming the address and where it came from. A report of a real
// run: test/e2e/controller.test.ts.
import { describe, expect, it } from 'vitest';
import { refusedAddress } from '../helpers/ports.js';
import { envWithout, runCommand } from '../helpers/cli.js';

const report = (args: string[], env?: NodeJS.ProcessEnv) => runCommand('scripts/report.ts', args, env ? { env } : {});

describe('npm run report', () => {
  it('--help lists the options and environment and exits 0; usage errors exit 2 with the usage', async () => {
    const [help, noRun, unknown] = await Promise.all([report(['--help']), report([]), report(['r', '--out', 'x.html', '--frobnicate'])]);
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toMatch(/^usage: npm run report -- <run> /);
    for (const flag of ['--out FILE', '--checkpoint-dir DIR', '--address HOST:PORT', '--namespace NS', '--connect-timeout-s N', 'TEMPORAL_ADDRESS']) {
      expect(help.stdout).toContain(flag);
    }
    expect(noRun.code).toBe(2);
    expect(noRun.stderr).toMatch(/^report: which run\? give its name \(workflow ID\)\nusage: npm run report -- <run>/);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^report: unknown option '--frobnicate'/);
  });

  it('with nothing at the address, fails within seconds naming it and its source', async () => {
    const address = await refusedAddress();
    const flag = await report(['some-run', '--address', address], envWithout('TEMPORAL_ADDRESS'));
    expect(flag.code).toBe(1);
    expect(flag.stderr.trim()).toBe(`report: cannot reach the Temporal server at ${address} (--address): connection refused`);
    // tsx's start-up included; the connection itself gives up after 2 s.
    expect(flag.ms).toBeLessThan(15_000);
  });
});
