// The model server's per-call file writes (capture rows, token files) share one bound: each is one
// small file operation, and 7,600 calls answered at once otherwise ran the process out of descriptors.
import { Slots } from '../common/async.js';

export const callFileSlots = new Slots(64);
