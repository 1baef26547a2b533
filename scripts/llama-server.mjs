#!/usr/bin/env node
// `npm run llama -- [--port 8080] [--api-key-env NAME]`: the llama.cpp server of
// examples/gym-llama.yaml in the foreground, once the bootstrap's background build is ready
// (it waits for it, saying so). The API key, if any, is read from the named environment variable.
import { spawn } from 'node:child_process';
import { parseArgs } from 'node:util';
import { llamaServerArgs, waitForLlama } from './llama-paths.mjs';

const { values } = parseArgs({ options: { port: { type: 'string', default: '8080' }, 'api-key-env': { type: 'string' } } });
const keyEnv = values['api-key-env'];
const apiKey = keyEnv ? process.env[keyEnv] : undefined;
if (keyEnv && !apiKey) {
  console.error(`llama: the environment variable ${keyEnv} is not set`);
  process.exit(2);
}
try {
  const { python, model } = await waitForLlama({ onWait: (m) => console.error(`llama: ${m}`) });
  const child = spawn(python, llamaServerArgs({ model, port: Number(values.port), ...(apiKey ? { apiKey } : {}) }), { stdio: 'inherit' });
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => child.kill(sig));
  child.on('exit', (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
} catch (err) {
  console.error(`llama: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
}
