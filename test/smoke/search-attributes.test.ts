// The controller's search attributes: one table (protocol/search-attributes.mjs) for the dev
// server, the worker's registration check and the workflows' typed keys; registered on a
// namespace that lacks them; a clear error naming the commands when they cannot be.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { INDEXED_VALUE_TYPE, SEARCH_ATTRIBUTES } from '../../protocol/search-attributes.mjs';
import { ensureSearchAttributes, registerCommand } from '../../scripts/search-attributes.mjs';
import * as keys from '../../workflows/search-attributes.js';
import { createLocalEnv, type LocalEnv } from '../helpers/temporal.js';

describe('the table and the keys', () => {
  it('every key the workflows set is in the table with its type, and every table entry has a key', () => {
    const defined = Object.values(keys).filter((k) => typeof k === 'object' && k !== null && 'type' in k) as Array<{ name: string; type: string }>;
    expect(Object.fromEntries(defined.map((k) => [k.name, k.type]))).toEqual(
      Object.fromEntries(Object.entries(SEARCH_ATTRIBUTES).map(([name, type]) => [name, type.toUpperCase()])),
    );
  });

  it('the documented queries quote the run name', () => {
    expect(keys.runQueries("it's").all).toBe("RunName = 'it\\'s'");
    expect(keys.runQueries('demo').failedCheckpoints).toBe("RunName = 'demo' AND WorkflowType = 'checkpointAttempt' AND ExecutionStatus = 'Failed'");
  });
});

describe('registration', () => {
  /** An operator API that lists `have` and refuses or records additions. */
  function operator(have: Record<string, number>, refuse?: string) {
    const added: Array<Record<string, number>> = [];
    return {
      added,
      connection: {
        operatorService: {
          listSearchAttributes: async () => ({ customAttributes: have }),
          addSearchAttributes: async (req: { searchAttributes: Record<string, number> }) => {
            if (refuse) throw new Error(refuse);
            added.push(req.searchAttributes);
          },
        },
      },
    };
  }

  it('adds only the missing ones and says which', async () => {
    const o = operator({ RunName: INDEXED_VALUE_TYPE.Keyword, Unrelated: 1 });
    const missing = Object.keys(SEARCH_ATTRIBUTES).filter((n) => n !== 'RunName');
    expect(await ensureSearchAttributes(o.connection, 'ns')).toEqual(missing);
    expect(Object.keys(o.added[0]!)).toEqual(missing);
    expect(o.added[0]!.TrainerStep).toBe(INDEXED_VALUE_TYPE.Int);
  });

  it('a cluster that refuses the registration (Temporal Cloud): the error names each attribute and the command', async () => {
    const o = operator({}, 'PermissionDenied: Request unauthorized.');
    const err = (await ensureSearchAttributes(o.connection, 'prod').catch((e: unknown) => e)) as Error;
    expect(err.message).toContain('namespace prod lacks the search attributes RunName, RunPhase');
    expect(err.message).toContain('PermissionDenied: Request unauthorized.');
    expect(err.message).toContain(registerCommand('prod', 'TrainerStep', 'Int'));
    expect(err.message).toContain('tcld namespace search-attributes add');
  });

  it('an attribute registered with another type is an error, not an addition', async () => {
    const o = operator({ TrainerStep: INDEXED_VALUE_TYPE.Keyword });
    await expect(ensureSearchAttributes(o.connection, 'ns')).rejects.toThrow('TrainerStep is Keyword, not Int');
    expect(o.added).toEqual([]);
  });
});

describe('on a dev server started without them', () => {
  let local: LocalEnv | undefined;
  beforeAll(async () => {
    local = await createLocalEnv({ searchAttributes: {} });
  });
  afterAll(async () => {
    await local?.teardown();
  });

  it('registers every one, then finds nothing missing', async () => {
    const { connection } = local!.env;
    const before = (await connection.operatorService.listSearchAttributes({ namespace: 'default' })).customAttributes ?? {};
    expect(Object.keys(before).filter((n) => n in SEARCH_ATTRIBUTES)).toEqual([]);
    expect(await ensureSearchAttributes(connection, 'default')).toEqual(Object.keys(SEARCH_ATTRIBUTES));
    const after = (await connection.operatorService.listSearchAttributes({ namespace: 'default' })).customAttributes ?? {};
    for (const [name, type] of Object.entries(SEARCH_ATTRIBUTES)) expect(after[name], name).toBe(INDEXED_VALUE_TYPE[type]);
    expect(await ensureSearchAttributes(connection, 'default')).toEqual([]);
  });
});
