// The API suites' small test runner: each test prints "ok"/"FAIL" with its time; the suite reads
// `results` at the end and records what it measured in `figures` (one process per suite).
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
