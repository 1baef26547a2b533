// A plain-code check of the agent's checkpoint record shape, ahead of its zod schema. Measured
// reason (restore profiles of `npm run bench -- scale --profile`): zod copies every object and
// array it checks, which dominated the agent's restore on cores every other participant is restoring on too. It accepts only what the
// schema accepts and gives back the same value: records with every defaulted field present, the
// way this agent writes them. Anything else (a missing default, an odd number, another writer's
// shape) returns undefined and goes through the schema, which decides and names the problem.
import { decodeEpisodeId } from '../../protocol/ids.js';

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const isNonEmptyString = (v: unknown): boolean => typeof v === 'string' && v.length > 0;
const isFiniteNumber = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v);
const isCount = (v: unknown): boolean => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

function onlyKeys(o: Obj, allowed: ReadonlySet<string>): boolean {
  for (const k in o) if (!allowed.has(k)) return false;
  return true;
}

function isStringMap(v: unknown): boolean {
  if (!isObj(v)) return false;
  for (const k in v) if (typeof v[k] !== 'string') return false;
  return true;
}

/** An episode ID with `attempt` written out (the schema's default would add it). */
function isFullEpisodeId(v: unknown): boolean {
  return isObj(v) && typeof v.attempt === 'number' && decodeEpisodeId(v) !== undefined;
}

const REQUEST_KEYS = new Set(['agent_session_id', 'episode_id', 'task_id', 'tool_accesses', 'sandbox_access']);
const TASK_ID_KEYS = new Set(['taskset', 'task_id']);
const GRANT_KEYS = new Set(['kind', 'name', 'required', 'base_url', 'cookies', 'headers']);
/** No whitespace anywhere: zod's trim and tab/newline stripping leave such a URL as it is. */
const PLAIN_HTTP_URL = /^https?:\/\/\S*$/i;

function isToolAccess(g: unknown): boolean {
  if (!isObj(g)) return false;
  if (g.kind === 'direct_http') {
    if (!onlyKeys(g, GRANT_KEYS) || !isNonEmptyString(g.name) || typeof g.required !== 'boolean') return false;
    if (typeof g.base_url !== 'string' || !PLAIN_HTTP_URL.test(g.base_url) || !URL.canParse(g.base_url)) return false;
    return isStringMap(g.cookies) && isStringMap(g.headers);
  }
  return isNonEmptyString(g.kind) && isNonEmptyString(g.name) && typeof g.required === 'boolean';
}

function isSeedRequest(v: unknown): boolean {
  if (!isObj(v) || !onlyKeys(v, REQUEST_KEYS)) return false;
  if (!isNonEmptyString(v.agent_session_id) || v.sandbox_access !== null || !Array.isArray(v.tool_accesses)) return false;
  if (v.episode_id !== undefined && v.episode_id !== null && !isFullEpisodeId(v.episode_id)) return false;
  const task = v.task_id;
  if (task !== undefined && task !== null) {
    if (!isObj(task) || !onlyKeys(task, TASK_ID_KEYS) || !isNonEmptyString(task.taskset) || !isNonEmptyString(task.task_id)) return false;
  }
  return v.tool_accesses.every(isToolAccess);
}

function isSession(v: unknown): boolean {
  if (!isObj(v) || !isSeedRequest(v.request)) return false;
  if (v.resources_cookies !== null && !isStringMap(v.resources_cookies)) return false;
  const obs = v.observations;
  if (obs !== null && !(isObj(obs) && typeof obs.source === 'string' && Array.isArray(obs.records) && Array.isArray(obs.gaps))) return false;
  if (!isCount(v.activations) || !isCount(v.completed_activation)) return false;
  const reply = v.completed_reply;
  return reply === null || (isObj(reply) && isObj(reply.response) && isStringMap(reply.cookies));
}

const LOOP_STATE_KEYS = [
  'step',
  'pending_tools',
  'new_outputs',
  'usage',
  'last_model_response',
  'model_server_cookies',
  'resources_server_cookies',
  'turns',
  'tool_records',
  'model_calls',
  'gaps',
] as const;
const LOOP_STATE_KEY_SET = new Set<string>(LOOP_STATE_KEYS);

function isLoopState(v: unknown): boolean {
  if (!isObj(v) || !onlyKeys(v, LOOP_STATE_KEY_SET) || !LOOP_STATE_KEYS.every((k) => k in v)) return false;
  if (!isCount(v.step) || typeof v.pending_tools !== 'boolean') return false;
  if (!Array.isArray(v.new_outputs) || !v.new_outputs.every((o) => isObj(o) && isNonEmptyString(o.type))) return false;
  const u = v.usage;
  if (u !== null && !(isObj(u) && isFiniteNumber(u.input_tokens) && isFiniteNumber(u.output_tokens) && isFiniteNumber(u.total_tokens))) {
    return false;
  }
  if (v.last_model_response !== null && !isObj(v.last_model_response)) return false;
  if (!isStringMap(v.model_server_cookies) || !isStringMap(v.resources_server_cookies)) return false;
  return Array.isArray(v.turns) && Array.isArray(v.tool_records) && Array.isArray(v.model_calls) && Array.isArray(v.gaps);
}

/**
 * True when the (plain-JSON) record certainly passes the agent record schema and the schema would
 * return an equal value; false means "ask the schema".
 */
export function isPlainAgentRecord(v: unknown): boolean {
  if (!isObj(v) || !isFullEpisodeId(v.episode_id) || !isNonEmptyString(v.session_key)) return false;
  if (v.episode !== null || !isSession(v.session)) return false;
  return v.boundary === null || isLoopState(v.boundary);
}
