import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { groupAlive } from '../../servers/launcher/group-liveness.js';
import { downDeployment, statusDeployment, upDeployment } from '../../servers/launcher/launcher.js';
import { hasRunState, readRunState } from '../../servers/launcher/run-dir.js';
import { tempDir } from '../helpers/temp-dir.js';

const EXAMPLE = fileURLToPath(new URL('../../examples/gym.yaml', import.meta.url));
const tmp = tempDir('gym-example', 'file');
const runDir = join(tmp, 'run');

afterAll(async () => {
  if (hasRunState(runDir)) await downDeployment(runDir, { graceMs: 1_000 }).catch(() => {});
});

describe('examples/gym.yaml', () => {
  it('comes up healthy with every server, and down leaves nothing', async () => {
    const d = await upDeployment({ config: EXAMPLE, runDir, env: { GYM_CONTROL_TOKEN: 'example-token', LOG_LEVEL: 'warn' } });
    expect(Object.keys(d.endpoints).sort()).toEqual([
      'counter',
      'counter_env',
      'genrm',
      'genrm_env',
      'policy_backend',
      'policy_model',
      'restart_env',
      'simple_agent',
      'weather',
      'weather_env',
      'weather_restart_only',
    ]);
    const status = await statusDeployment(runDir);
    expect(status.filter((s) => !s.healthy).map((s) => s.name)).toEqual([]);
    const state = readRunState(runDir);
    await downDeployment(runDir);
    for (const [name, s] of Object.entries(state.servers)) expect(groupAlive(s.pid, name), name).toBe(false);
  });
});
