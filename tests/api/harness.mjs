// The API suites' small test runner: each test prints "ok"/"FAIL" with its time, or "skip" with
// the reason it cannot run on this model; the suite reads `results` at the end and records what it
// measured in `figures` (one process per suite).
export const results = [];
export const figures = {};

export async function test(name, fn) {
  const t0 = performance.now();
  try {
    await fn();
    results.push({ name, ok: true });
    console.log(`ok    ${name} (${Math.round(performance.now() - t0)} ms)`);
  } catch (e) {
    results.push({ name, ok: false });
    console.log(`FAIL  ${name}: ${e.stack || e}`);
  }
}

// A test that this model cannot run (say, one that needs a trained model's content): printed and
// counted as skipped, with why.
export function skip(name, reason) {
  results.push({ name, ok: true, skipped: reason });
  console.log(`skip  ${name}: ${reason}`);
}

// The suite's closing line: counts, the skipped tests with their reasons, the figures.
export function summary() {
  const failed = results.filter((r) => !r.ok).length;
  const skipped = results.filter((r) => r.skipped).map((r) => ({ name: r.name, reason: r.skipped }));
  return { passed: results.length - failed - skipped.length, failed, skipped, figures };
}
