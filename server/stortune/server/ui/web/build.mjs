// Builds the dashboard into ../assets, which the wheel carries (a user installing it needs no
// Node). esbuild's output depends only on the sources, the locked dependencies and esbuild's
// version, so the committed files can be checked: `node build.mjs --check` builds into a
// temporary directory and fails when anything differs from ../assets (tests/ui runs it).
import * as esbuild from 'esbuild';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../../../../..'); // the repository: schemas/jsonschema lives there
const assets = resolve(here, '../assets');
const check = process.argv.includes('--check');
const out = check ? mkdtempSync(join(tmpdir(), 'stortune-ui-')) : assets;

const PAGE = ({ script, style }) => `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>stortune</title>
<link rel="stylesheet" href="assets/${style}">
<script type="module" src="assets/${script}"></script>
</head>
<body>
<noscript>The stortune dashboard needs JavaScript; the same data is in the CLI (stortune get hosts) and the REST API (/docs).</noscript>
<div id="app"></div>
</body>
</html>
`;

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
const result = await esbuild.build({
  entryPoints: { app: join(here, 'src/main.jsx') },
  bundle: true,
  splitting: true,
  format: 'esm',
  target: ['chrome100', 'firefox100', 'safari15'],
  minify: true,
  outdir: join(out, 'assets'),
  entryNames: '[name]-[hash]',
  chunkNames: 'chunk-[hash]',
  jsx: 'automatic',
  jsxImportSource: 'preact',
  alias: { '@schemas': join(root, 'schemas/jsonschema') },
  legalComments: 'eof',
  metafile: true,
  logLevel: 'warning',
  absWorkingDir: here,
});
const outputs = Object.entries(result.metafile.outputs);
const entry = outputs.find(([, o]) => o.entryPoint && o.entryPoint.endsWith('src/main.jsx'));
const script = basename(entry[0]);
const style = basename(entry[1].cssBundle);
// Flat: the server serves assets/NAME from one directory read at start.
for (const [file] of outputs) {
  writeFileSync(join(out, basename(file)), readFileSync(join(here, file)));
}
rmSync(join(out, 'assets'), { recursive: true, force: true });
writeFileSync(join(out, 'index.html'), PAGE({ script, style }));

if (check) {
  const digest = (dir) => Object.fromEntries(readdirSync(dir).sort().map((f) => [f, createHash('sha256').update(readFileSync(join(dir, f))).digest('hex')]));
  const want = digest(out);
  let have = {};
  try {
    have = digest(assets);
  } catch {
    // no assets yet
  }
  rmSync(out, { recursive: true, force: true });
  const differ = [...new Set([...Object.keys(want), ...Object.keys(have)])].filter((f) => want[f] !== have[f]);
  if (differ.length) {
    console.error(`server/stortune/server/ui/assets is not what the sources build to (${differ.join(', ')}): run ./dev up or node build.mjs, and commit the result`);
    process.exit(1);
  }
  console.log('assets are current');
} else {
  for (const f of readdirSync(out).sort()) console.log(`${f}  ${readFileSync(join(out, f)).length} bytes`);
}
