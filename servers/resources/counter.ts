// Counter (participants.md §4.8, `example_session_state_mgmt`): per-session integer state, so it
// is the `exported` example. Without a restore of its state a replacement attempt increments a
// fresh counter and cannot reach `expected_count`.
import { z } from 'zod';
import { materialized } from '../../protocol/deferred-json.js';
import { refuse } from '../../protocol/errors.js';
import type { ServerModule } from '../common/server-context.js';
import { buildResourcesServer, checkpointOptionFields, parseBody, seedReply, taskField, type SessionStateHooks } from './base.js';

export const CounterOptionsSchema = z.strictObject({
  ...checkpointOptionFields({ mode: 'exported', verify: 'wait' }),
});
export type CounterOptions = z.infer<typeof CounterOptionsSchema>;

const IncrementSchema = z.looseObject({ count: z.number().int() });

/** The session state hooks over `session id → counter` (§4.8). */
export function counterStateHooks(counters: Map<string, number>): SessionStateHooks {
  return {
    exportSessionStates(ids) {
      return new Map(ids.map((id) => [id, { count: counters.get(id) ?? 0 }]));
    },
    // Restored states arrive unparsed (checked on the records workers); a counter is tiny, so
    // each is read and validated here, before any is installed.
    deferredStates: true,
    restoreSessionStates(states) {
      // Validate every state before installing any.
      const parsed = new Map<string, number>();
      for (const [id, deferredState] of states) {
        const state = materialized(deferredState);
        const count = state && typeof state === 'object' ? (state as { count?: unknown }).count : undefined;
        if (typeof count !== 'number' || !Number.isSafeInteger(count)) {
          throw new Error(`state of session '${id}' needs an integer count, got ${JSON.stringify(state)}`);
        }
        parsed.set(id, count);
      }
      for (const [id, count] of parsed) counters.set(id, count);
    },
    retireSessionState(id) {
      counters.delete(id);
    },
  };
}

const counter: ServerModule<CounterOptions> = {
  optionsSchema: CounterOptionsSchema,
  async build(ctx, options) {
    const opts = CounterOptionsSchema.parse(options);
    const counters = new Map<string, number>();

    return buildResourcesServer(ctx, opts, {
      sessionHooks: counterStateHooks(counters),
      routes(app, sessions) {
        app.post('/seed_session', async (req) => {
          const id = sessions.of(req);
          const initial = taskField(req.body, 'initial_count');
          if (initial !== undefined && (typeof initial !== 'number' || !Number.isSafeInteger(initial))) {
            throw refuse('invalid_request', `initial_count: expected an integer, got ${JSON.stringify(initial)}`);
          }
          // Set only if absent: a replayed seed must not reset a counter already in use.
          if (typeof initial === 'number' && !counters.has(id)) counters.set(id, initial);
          return seedReply(req.body, id);
        });

        app.post('/increment_counter', async (req) => {
          const { count } = parseBody(IncrementSchema, req.body);
          const id = sessions.of(req);
          counters.set(id, (counters.get(id) ?? 0) + count);
          return { success: true };
        });

        app.post('/get_counter_value', async (req) => ({ count: counters.get(sessions.of(req)) ?? 0 }));

        app.post('/verify', async (req) => {
          const body = (req.body ?? {}) as Record<string, unknown>;
          const expected = taskField(body, 'expected_count');
          const current = counters.get(sessions.of(req));
          const reward = current !== undefined && current === expected ? 1.0 : 0.0;
          return { ...body, reward, mask_sample: false };
        });

        app.post('/close_session', async (req) => {
          const id = sessions.of(req);
          counters.delete(id);
          return { resources_session_id: id };
        });
      },
    });
  },
};

export default counter;
