// Manifest-last checkpoint storage (control-plane.md §9): one digest-named records file per
// participant, streamed line by line, then `manifest.json` created once and never replaced. Every
// failure is a typed `invalid_checkpoint_state` (§9.7); temporary files never outlive a call.
export { participantDir } from './paths.js';
export { deferMinBytes, readRecords, type ReadRecordsOptions, type ReadRecordsResult } from './reader.js';
export { startRecordsWrite, writeRecords, type RecordsWrite, type RecordsWriteOptions } from './writer.js';
