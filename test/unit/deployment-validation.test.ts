import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../../servers/common/config-error.js';
import { validateDeploymentFile, validateDeploymentText } from '../../servers/launcher/validate.js';

const EXAMPLE = fileURLToPath(new URL('../../examples/gym.yaml', import.meta.url));
const TOKEN = { GYM_CONTROL_TOKEN: 'test-token' };

/** The key a config error names, or '(accepted)'. */
async function keyOf(yaml: string, env: NodeJS.ProcessEnv = TOKEN): Promise<string> {
  try {
    await validateDeploymentText(yaml, env, 'gym.yaml');
  } catch (err) {
    if (err instanceof ConfigError) return err.key;
    throw err;
  }
  return '(accepted)';
}

const base = `
servers:
  policy_backend: { kind: inference }
  policy_model: { kind: model, options: { backend: policy_backend } }
`;

describe('deployment validation (before anything starts)', () => {
  it('accepts a minimal deployment and fills option defaults', async () => {
    const v = await validateDeploymentText(base, {});
    expect(v.deployment.checkpoint.enabled).toBe(false);
    expect(v.types).toEqual({ policy_backend: 'tiny_policy', policy_model: 'policy_model' });
    expect(v.options.policy_model).toEqual({ backend: 'policy_backend', checkpoint_policy: false, checkpoint_generation_cuts: false });
  });

  it('workers: several processes for any participant kind, not for an inference backend or a group-scored verifier', async () => {
    expect(await keyOf(`${base}  w: { kind: resources, type: weather, workers: 2 }\n`)).toBe('(accepted)');
    expect(await keyOf(`${base}  w: { kind: resources, type: weather, workers: 0 }\n`)).toBe('servers.w.workers');
    expect(await keyOf(`servers:\n  b: { kind: inference, workers: 2 }\n`)).toBe('servers.b.workers');
    expect(await keyOf(`${base}  g: { kind: resources, type: genrm_compare, workers: 2 }\n`)).toBe('servers.g.workers');
  });

  it('names the key of every kind of mistake', async () => {
    expect(await keyOf(`${base}  x: { kind: simulator }\n`)).toBe('servers.x.kind');
    expect(await keyOf(`${base}  x: { kind: resources, type: wether }\n`)).toBe('servers.x.type');
    expect(await keyOf(`${base}  x: { kind: resources, optons: {} }\n`)).toBe('servers.x.optons');
    expect(await keyOf(`servers:\n  policy_model: { kind: model, options: { backend: b, temperature: 1 } }\n`)).toBe(
      'servers.policy_model.options.temperature',
    );
    expect(await keyOf(`servers:\n  policy_model: { kind: model, options: {} }\n`)).toBe('servers.policy_model.options.backend');
    expect(await keyOf(`servers:\n  weather: { kind: resources, type: weather, options: { checkpoint_mode: exportd } }\n`)).toBe(
      'servers.weather.options.checkpoint_mode',
    );
    expect(await keyOf(`servers:\n  bad/name: { kind: inference }\n`)).toBe('servers.bad/name');
    expect(await keyOf(`${base}sevrers: {}\n`)).toBe('sevrers');
    expect(await keyOf(`checkpoint: { enabled: true, lease: 3 }\n${base}`)).toBe('checkpoint.lease');
    expect(await keyOf(`${base}  p2: { kind: model, port: 70000, options: { backend: x } }\n`)).toBe('servers.p2.port');
  });

  it('requires the control token when checkpointing is enabled, and takes it from GYM_CONTROL_TOKEN', async () => {
    const yaml = `checkpoint: { enabled: true }\n${base}`;
    expect(await keyOf(yaml, {})).toBe('checkpoint.control_auth_token');
    const v = await validateDeploymentText(yaml, TOKEN);
    expect(v.deployment.checkpoint.control_auth_token).toBe('test-token');
  });

  it('bad YAML names the file', async () => {
    expect(await keyOf('servers: [unclosed\n')).toBe('gym.yaml');
    expect(await keyOf('- a list\n')).toBe('(root)');
  });

  it('a missing file names the file', async () => {
    await expect(validateDeploymentFile('/nonexistent/gym.yaml', TOKEN)).rejects.toThrow(/^\/nonexistent\/gym\.yaml: cannot read/);
  });

  it('examples/gym.yaml has every server kind and every example resources server, and validates', async () => {
    expect(await keyOf((await import('node:fs')).readFileSync(EXAMPLE, 'utf8'), {})).toBe('checkpoint.control_auth_token');
    const v = await validateDeploymentFile(EXAMPLE, TOKEN);
    const kinds = new Set(Object.values(v.deployment.servers).map((s) => s.kind));
    expect([...kinds].sort()).toEqual(['agent', 'environment', 'inference', 'model', 'resources']);
    expect(v.types).toMatchObject({ weather: 'weather', counter: 'counter', genrm: 'genrm_compare', weather_restart_only: 'weather' });
    expect(v.options).toMatchObject({
      weather: { checkpoint_mode: 'stateless', checkpoint_verify: 'replay' },
      counter: { checkpoint_mode: 'exported' },
      weather_restart_only: { checkpoint_mode: 'restart_only' },
      genrm: { num_rollouts_per_prompt: 4 },
      restart_env: { resources: 'weather_restart_only' },
    });
    expect(v.deployment.checkpoint).toMatchObject({ enabled: true, lease_grace_seconds: 600 });
  });
});
