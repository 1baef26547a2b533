// Session handles (participants.md §2.5): the sessions one episode owns, enough to reuse them after
// a restore and to close them. IDs are minted once per first attempt and reused by a restored
// replacement, cookies included; the verify mode rides along so a restored episode still knows how
// to run `/verify`.
import { randomBytes } from 'node:crypto';
import { z } from 'zod';

export const VerifyModeSchema = z.enum(['wait', 'replay']);

const CookiesSchema = z.record(z.string(), z.string());

// Not closed: a record written by another implementation may carry fields we do not use.
export const SessionHandlesSchema = z.object({
  resources_session_id: z.string().regex(/^resources-session-[0-9a-f]{32}$/),
  resources_cookies: CookiesSchema.default({}),
  agent_session_id: z.string().regex(/^agent-session-[0-9a-f]{32}$/),
  agent_cookies: CookiesSchema.default({}),
  resources_verify: VerifyModeSchema.default('wait'),
});
export type SessionHandles = z.infer<typeof SessionHandlesSchema>;

export function mintHandles(): SessionHandles {
  return {
    resources_session_id: `resources-session-${randomBytes(16).toString('hex')}`,
    resources_cookies: {},
    agent_session_id: `agent-session-${randomBytes(16).toString('hex')}`,
    agent_cookies: {},
    resources_verify: 'wait',
  };
}

/** A copy for a boundary: later cookie updates must not change a boundary already recorded. */
export function snapshotHandles(h: SessionHandles): SessionHandles {
  return { ...h, resources_cookies: { ...h.resources_cookies }, agent_cookies: { ...h.agent_cookies } };
}
