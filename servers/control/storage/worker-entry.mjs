// A worker thread starts from plain JavaScript: register tsx (every process of this project runs
// TypeScript under it) before loading the TypeScript worker module.
import { register } from 'tsx/esm/api';

register();
const worker = await import('./worker.ts');
export const { scan } = worker;
