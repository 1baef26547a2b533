// The run config file as `npm run run -- start` reads it: examples/run.yaml parses, and a bad
// value of the controller section is a config error naming its key.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadRunConfig } from '../../scripts/run.js';
import { ConfigError } from '../../servers/common/config-error.js';
import { tempDir } from '../helpers/temp-dir.js';

const dir = tempDir('run-config', 'file');

const example = path.join(import.meta.dirname, '..', '..', 'examples', 'run.yaml');

function configWith(controller: string): string {
  const file = path.join(dir, `run-${Math.random().toString(36).slice(2)}.yaml`);
  writeFileSync(
    file,
    `run: { name: r, gym_run_dir: /tmp/g, checkpoint_dir: /tmp/c }\ngrpo: { num_prompts_per_step: 1, num_generations_per_prompt: 2, max_num_steps: 1, tasksets: [counter] }\n${controller}\n`,
  );
  return file;
}

function configError(file: string): ConfigError {
  try {
    loadRunConfig(file);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return err as ConfigError;
  }
  throw new Error('expected a config error');
}

describe('the llama.cpp examples', () => {
  it('examples/run-llama.yaml parses: trainer none over the deployment of examples/gym-llama.yaml', async () => {
    const cfg = loadRunConfig(path.join(import.meta.dirname, '..', '..', 'examples', 'run-llama.yaml'));
    expect(cfg.trainer).toEqual({ kind: 'none', enabled: true });
    expect(cfg.grpo.environments).toEqual({ weather: 'weather_env' });
    const { validateDeploymentFile } = await import('../../servers/launcher/validate.js');
    const v = await validateDeploymentFile(path.join(import.meta.dirname, '..', '..', 'examples', 'gym-llama.yaml'), {
      GYM_CONTROL_TOKEN: 't',
      LLAMA_API_KEY: 'k',
    });
    expect(Object.keys(v.deployment.servers).sort()).toEqual(['policy_model', 'simple_agent', 'weather', 'weather_env']);
    expect(v.deployment.servers.policy_model!.options).toMatchObject({ backend_api: 'openai', served_model: 'smollm2', api_key_env: 'LLAMA_API_KEY' });
  });
});

describe('run config: controller section', () => {
  it('examples/run.yaml parses, with the /run heartbeat timeout it documents', () => {
    expect(loadRunConfig(example).controller).toMatchObject({ run_heartbeat_timeout_s: 120 });
  });

  it('defaults the /run heartbeat timeout to 120 s and takes another value', () => {
    expect(loadRunConfig(configWith('')).controller.run_heartbeat_timeout_s).toBe(120);
    expect(loadRunConfig(configWith('controller: { run_heartbeat_timeout_s: 15 }')).controller.run_heartbeat_timeout_s).toBe(15);
  });

  it('a value below 5 s, or an unknown key, is an error naming the key', () => {
    expect(configError(configWith('controller: { run_heartbeat_timeout_s: 1 }')).message).toContain('controller.run_heartbeat_timeout_s');
    expect(configError(configWith('controller: { heartbeat_s: 30 }')).message).toContain('controller.heartbeat_s');
  });
});
