// What the controller derives per environment from the capabilities participants report in status.
import { describe, expect, it } from 'vitest';
import { environmentCapabilities } from '../../activities/gym.js';

const statuses = {
  counter_env: { kind: 'environment', capabilities: { agent: 'simple_agent', resources: 'counter' } },
  genrm_env: { kind: 'environment', capabilities: { agent: 'simple_agent', resources: 'genrm' } },
  restart_env: { kind: 'environment', capabilities: { agent: 'plain_agent', resources: 'weather_restart_only' } },
  bare_env: { kind: 'environment' },
  simple_agent: { kind: 'agent', capabilities: { supports_continuations: true } },
  plain_agent: { kind: 'agent', capabilities: { supports_continuations: false } },
  counter: { kind: 'resources', capabilities: { checkpoint_mode: 'exported', checkpoint_verify: 'wait', group_size: null, cohort_collection_timeout_s: null } },
  genrm: { kind: 'resources', capabilities: { checkpoint_mode: 'stateless', checkpoint_verify: 'replay', group_size: 4, cohort_collection_timeout_s: 1800 } },
  weather_restart_only: { kind: 'resources', capabilities: { checkpoint_mode: 'restart_only', checkpoint_verify: 'replay', group_size: null } },
};

describe('environmentCapabilities', () => {
  it('joins each environment with its agent and resources server', () => {
    const caps = environmentCapabilities(statuses);
    expect(Object.keys(caps).sort()).toEqual(['bare_env', 'counter_env', 'genrm_env', 'restart_env']);
    expect(caps.counter_env).toEqual({
      environment: 'counter_env',
      agent: 'simple_agent',
      supports_continuations: true,
      resources_checkpoint_mode: 'exported',
      verify_replayable: false,
      group_size: null,
      cohort_collection_timeout_s: null,
    });
    expect(caps.genrm_env).toMatchObject({
      supports_continuations: true,
      resources_checkpoint_mode: 'stateless',
      verify_replayable: true,
      group_size: 4,
      cohort_collection_timeout_s: 1800,
    });
    expect(caps.restart_env).toMatchObject({ agent: 'plain_agent', supports_continuations: false, resources_checkpoint_mode: 'restart_only' });
  });

  it('takes an environment that reports nothing at its most conservative', () => {
    expect(environmentCapabilities(statuses).bare_env).toEqual({
      environment: 'bare_env',
      agent: '',
      supports_continuations: false,
      resources_checkpoint_mode: 'restart_only',
      verify_replayable: false,
      group_size: null,
      cohort_collection_timeout_s: null,
    });
  });
});
