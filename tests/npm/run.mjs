// CTest entry: runs one test file with node's test runner. Without `npm ci` having installed
// the pinned openai package the test is skipped (exit 77), unless ATTNRES_REQUIRE_NPM_TESTS=1
// (CI), where that is a failure.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const dir = path.dirname(fileURLToPath(import.meta.url));
const file = process.argv[2];
if (!fs.existsSync(path.join(dir, 'node_modules', 'openai', 'package.json'))) {
  const msg = `tests/npm: the openai package is not installed; run: npm ci --prefix ${dir}`;
  if (process.env.ATTNRES_REQUIRE_NPM_TESTS === '1') {
    console.error(msg);
    process.exit(1);
  }
  console.log(`SKIPPED: ${msg}`);
  process.exit(77);
}
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', path.join(dir, file)], {
  stdio: 'inherit',
  cwd: dir,
});
process.exit(r.status ?? 1);
