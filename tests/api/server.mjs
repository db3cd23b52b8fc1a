// Starts `flashserve serve` on a free loopback port for the API tests and waits until it says
// where it listens. Resolves with {proc, port, base, log()}; rejects with the server's log when it
// exits or does not start within 30 s.
import { spawn } from 'node:child_process';

export async function spawnServer(binary, argv) {
  const proc = spawn(binary, ['serve', '--port', '0', ...argv], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('server did not start:\n' + log)), 30000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(t);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => reject(new Error(`server exited (${code}):\n${log}`)));
  });
  return { proc, port, base: `http://127.0.0.1:${port}`, log: () => log };
}
