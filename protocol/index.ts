export * from './errors.js';
export * from './ids.js';
export * from './manifest.js';
export * from './control.js';
