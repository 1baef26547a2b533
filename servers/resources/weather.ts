// Weather (participants.md §4.9): one stateless tool, `/get_weather {city}`. Declared `stateless` +
// `replay` by default; the YAML may override either option, e.g. a restart-only variant is
// `{ kind: resources, type: weather, options: { checkpoint_mode: restart_only } }` and a
// wait-verify one adds `checkpoint_verify: wait`. `verify_delay_ms` keeps a verify in flight
// (tests of readiness and replayable admission).
import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import { ProtocolError } from '../../protocol/errors.js';
import type { ServerModule } from '../common/server-context.js';
import { buildResourcesServer, checkpointOptionFields, parseBody, seedReply, taskField } from './base.js';

export const WeatherOptionsSchema = z.strictObject({
  ...checkpointOptionFields({ mode: 'stateless', verify: 'replay' }),
  verify_delay_ms: z.number().int().min(0).default(0),
});
export type WeatherOptions = z.infer<typeof WeatherOptionsSchema>;

const GetWeatherSchema = z.looseObject({ city: z.string().min(1) });

/** Deterministic text per city (the same city always gets the same weather). */
export function weatherDescription(city: string): string {
  const kinds = ['cold', 'sunny', 'rainy', 'windy', 'foggy', 'warm'];
  let sum = 0;
  for (const ch of city) sum = (sum + ch.codePointAt(0)!) % 9973;
  // SF keeps the reference example's answer.
  const kind = city === 'SF' ? 'cold' : kinds[sum % kinds.length]!;
  return `The weather in ${city} is ${kind}.`;
}

/** 1.0 iff the response output has a `get_weather` function call whose `city` is the task's city. */
export function weatherReward(body: unknown): number {
  const want = taskField(body, 'city');
  const output = (body as { response?: { output?: unknown } } | undefined)?.response?.output;
  if (typeof want !== 'string' || !Array.isArray(output)) return 0;
  for (const item of output) {
    if (!item || typeof item !== 'object') continue;
    const it = item as { type?: unknown; name?: unknown; arguments?: unknown };
    if (it.type !== 'function_call' || it.name !== 'get_weather') continue;
    let args: unknown = it.arguments;
    if (typeof args === 'string') {
      try {
        args = JSON.parse(args);
      } catch {
        continue;
      }
    }
    if (args && typeof args === 'object' && (args as { city?: unknown }).city === want) return 1;
  }
  return 0;
}

interface SeedBinding {
  episode: string;
  task: string;
  closed: boolean;
}

/** Closed sessions kept for the "not closed" check; the oldest are dropped past this many. */
const MAX_KEPT_SESSIONS = 100_000;

const weather: ServerModule<WeatherOptions> = {
  optionsSchema: WeatherOptionsSchema,
  async build(ctx, options) {
    const opts = WeatherOptionsSchema.parse(options);
    const bindings = new Map<string, SeedBinding>();
    const conflict = (detail: string): ProtocolError => new ProtocolError('invalid_request', detail, 409);

    return buildResourcesServer(ctx, opts, {
      routes(app, sessions) {
        app.post('/seed_session', async (req) => {
          const id = sessions.of(req);
          const body = (req.body ?? {}) as Record<string, unknown>;
          if (typeof body.resources_session_id === 'string') {
            // Native seed: the session must be new, or this very episode/task seeding again.
            const episode = stableKey(body.episode_id);
            const task = stableKey(body.task_id);
            const cur = bindings.get(id);
            if (cur?.closed) throw conflict(`resources session '${id}' is closed`);
            if (cur && (cur.episode !== episode || cur.task !== task)) throw conflict(`resources session '${id}' is bound to another episode or task`);
            if (!cur) {
              bindings.set(id, { episode, task, closed: false });
              if (bindings.size > MAX_KEPT_SESSIONS) bindings.delete(bindings.keys().next().value!);
            }
          }
          return seedReply(body, id);
        });

        app.post('/get_weather', async (req) => {
          const { city } = parseBody(GetWeatherSchema, req.body);
          return { city, weather_description: weatherDescription(city) };
        });

        app.post('/verify', async (req) => {
          if (opts.verify_delay_ms > 0) await sleep(opts.verify_delay_ms);
          const body = (req.body ?? {}) as Record<string, unknown>;
          return { ...body, reward: weatherReward(body), mask_sample: false };
        });

        app.post('/close_session', async (req) => {
          const body = (req.body ?? {}) as Record<string, unknown>;
          const id = typeof body.resources_session_id === 'string' && body.resources_session_id ? body.resources_session_id : sessions.of(req);
          const cur = bindings.get(id);
          if (cur && body.episode_id !== undefined && cur.episode !== stableKey(body.episode_id)) {
            throw conflict(`resources session '${id}' was seeded by another episode`);
          }
          if (cur) cur.closed = true;
          return { resources_session_id: id };
        });
      },
    });
  },
};

export default weather;

/** JSON with sorted keys and `attempt` defaulted, so equal identities compare equal. */
function stableKey(v: unknown): string {
  if (v && typeof v === 'object' && !Array.isArray(v) && 'rollout_id' in v && !('attempt' in v)) v = { ...v, attempt: 0 };
  return JSON.stringify(sortKeys(v)) ?? 'null';
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === 'object') {
    return Object.fromEntries(
      Object.keys(v)
        .sort()
        .map((k) => [k, sortKeys((v as Record<string, unknown>)[k])]),
    );
  }
  return v;
}
