// Running an activity outside a worker, and reading the ApplicationFailure it fails with.
import { ApplicationFailure } from '@temporalio/common';
import { MockActivityEnvironment } from '@temporalio/testing';
import { DefaultLogger } from '@temporalio/worker';
import { expect } from 'vitest';

/** A fresh mock activity context (cancel() is per context); failures are expected here, keep it quiet. */
export function mockEnv(): MockActivityEnvironment {
  return new MockActivityEnvironment(undefined, { logger: new DefaultLogger('ERROR') });
}

export function runActivity<A, R>(fn: (a: A) => Promise<R>, arg: A): Promise<R> {
  return mockEnv().run(fn, arg);
}

/** The ApplicationFailure `p` rejects with (fails the test when it resolves or rejects otherwise). */
export async function failureOf(p: Promise<unknown>): Promise<ApplicationFailure> {
  const err = await p.then(
    () => {
      throw new Error('expected a failure');
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ApplicationFailure);
  return err as ApplicationFailure;
}
