// Which module implements each server kind/type. Loaded lazily so a process imports only its own.
import { ConfigError } from './common/config-error.js';
import type { ServerEntry } from './common/deployment.js';
import type { ServerModule } from './common/server-context.js';

// biome-ignore lint/suspicious/noExplicitAny: each module has its own options type; the registry only hands them out.
type Loader = () => Promise<{ default: ServerModule<any> }>;

const DEFAULT_TYPE: Record<ServerEntry['kind'], string> = {
  environment: 'single_agent_turn',
  agent: 'simple_agent',
  model: 'policy_model',
  resources: 'weather',
  inference: 'tiny_policy',
};

const MODULES: Record<string, Loader> = {
  'environment:single_agent_turn': () => import('./environment/module.js'),
  'agent:simple_agent': () => import('./agent/module.js'),
  'model:policy_model': () => import('./model/module.js'),
  'inference:tiny_policy': () => import('./inference/module.js'),
  'resources:weather': () => import('./resources/weather.js'),
  'resources:counter': () => import('./resources/counter.js'),
  'resources:genrm_compare': () => import('./resources/genrm-compare.js'),
};

export function serverTypeOf(entry: ServerEntry): string {
  return entry.type ?? DEFAULT_TYPE[entry.kind];
}

// biome-ignore lint/suspicious/noExplicitAny: as above.
export async function loadServerModule(name: string, entry: ServerEntry): Promise<ServerModule<any>> {
  const type = serverTypeOf(entry);
  const load = MODULES[`${entry.kind}:${type}`];
  if (!load) {
    const known = Object.keys(MODULES)
      .filter((k) => k.startsWith(`${entry.kind}:`))
      .map((k) => k.split(':')[1]);
    throw new ConfigError(`servers.${name}.type`, `unknown ${entry.kind} server type '${type}' (known: ${known.join(', ')})`);
  }
  return (await load()).default;
}
