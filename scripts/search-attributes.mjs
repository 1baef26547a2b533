// Every custom search attribute of protocol/search-attributes.mjs registered in a namespace before
// a workflow sets one: a cluster refuses a start or an upsert of an unknown attribute, and a run
// whose workflow task fails on it would stall. The dev server and a self-hosted cluster take the
// registration from us (the operator API); Temporal Cloud does not (its control plane does it),
// so there the error names what to register and how.
import { INDEXED_VALUE_TYPE, SEARCH_ATTRIBUTES } from '../protocol/search-attributes.mjs';

const TYPE_NAME = Object.fromEntries(Object.entries(INDEXED_VALUE_TYPE).map(([name, n]) => [n, name]));

/** The command a user runs to register one attribute. */
export function registerCommand(namespace, name, type) {
  return `temporal operator search-attribute create --namespace ${namespace} --name ${name} --type ${type}`;
}

/**
 * Registers the missing attributes; returns their names (none: all were there).
 * Throws, naming every attribute and the commands, when one has another type or cannot be added.
 * @param {{ operatorService: { listSearchAttributes: Function, addSearchAttributes: Function } }} connection
 * @param {string} namespace
 * @param {Readonly<Record<string, string>>} [wanted]
 * @returns {Promise<string[]>}
 */
export async function ensureSearchAttributes(connection, namespace, wanted = SEARCH_ATTRIBUTES) {
  const customAttributes = (await connection.operatorService.listSearchAttributes({ namespace })).customAttributes ?? {};
  const clashing = Object.entries(wanted).filter(([name, type]) => name in customAttributes && customAttributes[name] !== INDEXED_VALUE_TYPE[type]);
  if (clashing.length) {
    const what = clashing.map(([name, type]) => `${name} is ${TYPE_NAME[customAttributes[name]] ?? customAttributes[name]}, not ${type}`).join('; ');
    throw new Error(`search attributes of namespace ${namespace} have other types than the controller sets: ${what}`);
  }
  const missing = Object.entries(wanted).filter(([name]) => !(name in customAttributes));
  if (!missing.length) return [];
  try {
    await connection.operatorService.addSearchAttributes({
      namespace,
      searchAttributes: Object.fromEntries(missing.map(([name, type]) => [name, INDEXED_VALUE_TYPE[type]])),
    });
  } catch (err) {
    const commands = missing.map(([name, type]) => `  ${registerCommand(namespace, name, type)}`).join('\n');
    throw new Error(
      `namespace ${namespace} lacks the search attributes ${missing.map(([name]) => name).join(', ')} and they could not be registered ` +
        `(${String(err?.message ?? err).split('\n')[0]}); register them (on Temporal Cloud: tcld namespace search-attributes add) and start again:\n${commands}`,
    );
  }
  return missing.map(([name]) => name);
}
