// Retryability is defined once, in the error table: the coordination client's classification and
// the workflows' non-retryable failure types must agree with it for every code.
import { describe, expect, it } from 'vitest';
import { failureClass } from '../../activities/coordination.js';
import { FAILURE_TYPES, NON_RETRYABLE_ERROR_TYPES } from '../../protocol/controller.js';
import { ERROR_CODES, ERRORS, isNonRetryableCode } from '../../protocol/errors.js';

describe('retryability', () => {
  it.each(ERROR_CODES)('%s: the activity and workflow lists follow the table', (code) => {
    const { retryable } = ERRORS[code];
    expect(isNonRetryableCode(code)).toBe(!retryable);
    expect(NON_RETRYABLE_ERROR_TYPES.includes(code)).toBe(!retryable);
    // As a control-plane 4xx reply: a refusal the workflow fails on, or one worth sending again.
    expect(failureClass({ status: 409, code, detail: '', description: '' })).toBe(retryable ? 'retryable_refusal' : 'refusal');
  });

  it('the workflow list adds only the activities own final failure types', () => {
    const extra = NON_RETRYABLE_ERROR_TYPES.filter((t) => !(ERROR_CODES as readonly string[]).includes(t));
    expect(extra.sort()).toEqual([FAILURE_TYPES.notReady, FAILURE_TYPES.invariant, FAILURE_TYPES.trainerBehind, FAILURE_TYPES.trainerAhead].sort());
    expect(NON_RETRYABLE_ERROR_TYPES).not.toContain(FAILURE_TYPES.transient);
    expect(NON_RETRYABLE_ERROR_TYPES).not.toContain(FAILURE_TYPES.storage);
  });

  it('an unknown code is not final (a newer peer may send one worth retrying)', () => {
    expect(isNonRetryableCode('some_future_code')).toBe(false);
    expect(isNonRetryableCode('constructor')).toBe(false);
    expect(failureClass({ status: 409, code: 'some_future_code', detail: '', description: '' })).toBe('retryable_refusal');
  });
});
