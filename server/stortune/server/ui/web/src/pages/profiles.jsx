// Profiles: the list, each one's YAML and the hosts it selects, and the editor: checked as
// you type against the StorageProfile JSON Schema (schemas/jsonschema, built into this chunk),
// then by the server (a dry run answers each host's plan, or a 422 naming every field), with
// each error shown at its line. Loaded only when the page is first opened.
// CLI: stortune get profiles; stortune diff -f FILE; stortune apply -f FILE [--dry-run].
import { Validator } from '@cfworker/json-schema';
import { isMap, isPair, isScalar, isSeq, LineCounter, parseDocument, stringify } from 'yaml';
import { useMemo, useRef, useState } from 'preact/hooks';
import schema from '@schemas/storageprofile.schema.json';
import { api } from '../api.js';
import { Empty, ErrorBox, Labels, Placeholder, Section, useCan, WRITE } from '../components.jsx';
import { selectorText, when } from '../format.js';
import { useFetch, usePoll } from '../hooks.js';
import { go, href } from '../router.js';
import { RolloutSection } from './rollout.jsx';

const NEW = '_new'; // not a valid profile name: '#/profiles/_new' is the empty editor
const validator = new Validator(schema, '2020-12', false);
const TEMPLATE = `apiVersion: stortune/v1
kind: StorageProfile
metadata:
  name: my-profile
spec:
  hostSelector:
    matchLabels: {role: streamer}
  priority: 100
  mode: audit
  rules:
    - name: disks
      match: {kind: [disk]}
      settings: {read_ahead_kb: 4096}
`;

export function documentOf(profile) {
  const { name, labels, annotations } = profile.metadata;
  const metadata = { name };
  if (labels && Object.keys(labels).length) metadata.labels = labels;
  if (annotations && Object.keys(annotations).length) metadata.annotations = annotations;
  return { apiVersion: profile.apiVersion, kind: profile.kind, metadata, spec: profile.spec };
}

/** 'spec.rules[0].settings.x' (API causes) or '#/spec/rules/0' (JSON Schema) -> path parts. */
export function pathOf(field) {
  if (field.startsWith('#')) {
    return field.slice(1).split('/').filter(Boolean).map((p) => decodeURIComponent(p.replace(/~1/g, '/').replace(/~0/g, '~')))
      .map((p) => (/^\d+$/.test(p) ? Number(p) : p));
  }
  const parts = [];
  for (const m of field.matchAll(/([^.[\]]+)|\[(\d+)\]/g)) parts.push(m[2] !== undefined ? Number(m[2]) : m[1]);
  return parts;
}

/** The 1-based line of the deepest node of the YAML document the path reaches. */
function lineOf(doc, counter, path) {
  let node = doc.contents;
  let offset = node && node.range ? node.range[0] : 0;
  for (const key of path) {
    if (isMap(node)) {
      const pair = node.items.find((p) => isPair(p) && isScalar(p.key) && String(p.key.value) === String(key));
      if (!pair) break;
      offset = pair.key.range ? pair.key.range[0] : offset;
      node = pair.value;
    } else if (isSeq(node) && typeof key === 'number' && node.items[key]) {
      node = node.items[key];
      offset = node.range ? node.range[0] : offset;
    } else break;
  }
  return counter.linePos(offset).line;
}

/** The JSON Schema's errors, the innermost per place (the outer ones only say "does not match"). */
const WRAPPERS = new Set(['properties', 'allOf', '$ref', 'items', 'prefixItems', '$defs']);

function schemaErrors(value) {
  const result = validator.validate(value);
  if (result.valid) return [];
  const leaves = result.errors.filter((e) => !WRAPPERS.has(e.keyword));
  const errors = leaves.length ? leaves : result.errors;
  const kept = errors.filter((e) => !errors.some((o) => o !== e && o.instanceLocation.startsWith(e.instanceLocation + '/')));
  const seen = new Set();
  return kept.filter((e) => {
    const key = `${e.instanceLocation} ${e.error}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  }).map((e) => ({ field: e.instanceLocation, message: e.error, source: 'schema' }));
}

function check(text) {
  const counter = new LineCounter();
  const doc = parseDocument(text, { lineCounter: counter, prettyErrors: false, uniqueKeys: true });
  const problems = doc.errors.map((e) => ({
    line: e.linePos ? e.linePos[0].line : counter.linePos(e.pos[0]).line, field: 'YAML', message: e.message.split('\n')[0], source: 'yaml',
  }));
  if (problems.length) return { doc, counter, problems, value: null };
  const value = doc.toJS();
  const found = schemaErrors(value).map((e) => ({ ...e, line: lineOf(doc, counter, pathOf(e.field)) }));
  return { doc, counter, problems: found, value };
}

function Plans({ plans }) {
  const entries = Object.entries(plans || {});
  if (!entries.length) return <p class="muted">No host is selected, nor was before: nothing would change.</p>;
  return (
    <div class="plans" data-testid="plans">
      {entries.map(([host, plan]) => (
        <div key={host} class="plan">
          <h4><a href={href(['hosts', host])}>{host}</a>{!plan.topologyReported && ' (topology not reported yet)'}</h4>
          {!plan.changes.length && !plan.restorations.length && !plan.rejections.length && <p class="muted">in sync: nothing to do</p>}
          <ul class="plain">
            {plan.changes.map((c, i) => (
              <li key={`c${i}`}>{c.device} {c.tunable}: {String(c.current ?? '–')} → {String(c.desired)}</li>
            ))}
            {plan.restorations.map((r, i) => (
              <li key={`r${i}`}>{r.device} {r.tunable}: put back to {String(r.value ?? r.original ?? '')} ({r.to || 'original'})</li>
            ))}
            {plan.rejections.map((r, i) => <li key={`x${i}`} class="row-bad">{r.device} {r.tunable}: {r.reason || r.message}</li>)}
          </ul>
        </div>
      ))}
    </div>
  );
}

function Editor({ name, initial, resourceVersion }) {
  const [text, setText] = useState(initial);
  const [server, setServer] = useState({ causes: [], error: null, plans: null, saved: null, busy: false });
  const gutter = useRef(null);
  const checked = useMemo(() => check(text), [text]);
  const serverProblems = server.causes.map((c) => ({ ...c, line: lineOf(checked.doc, checked.counter, pathOf(c.field)), source: 'server' }));
  const problems = [...checked.problems, ...serverProblems];
  const bad = new Set(problems.map((p) => p.line));
  const lines = text.split('\n').length;
  const creating = name === NEW;

  async function send(dryRun) {
    setServer({ causes: [], error: null, plans: null, saved: null, busy: true });
    let body = text;
    if (!creating && resourceVersion && checked.value) {
      // Stale-write guard: the version this edit started from (409 when someone saved since).
      const value = checked.value;
      value.metadata = { ...(value.metadata || {}), resourceVersion };
      body = value;
    }
    try {
      const target = creating ? 'profiles' : `profiles/${encodeURIComponent(name)}`;
      const { data } = await api(target, { method: creating ? 'POST' : 'PUT', body, query: dryRun ? { dryRun: 'All' } : undefined });
      if (dryRun) setServer({ causes: [], error: null, plans: data.plans, saved: null, busy: false });
      else {
        setServer({ causes: [], error: null, plans: null, saved: data.metadata.name, busy: false });
        go(['profiles', data.metadata.name]);
      }
    } catch (e) {
      setServer({ causes: e.causes || [], error: e, plans: null, saved: null, busy: false });
    }
  }

  return (
    <div class="editor-wrap">
      <div class="editor">
        <pre class="gutter" ref={gutter} aria-hidden="true">
          {Array.from({ length: lines }, (_, i) => (
            <span key={i} class={bad.has(i + 1) ? 'bad-line' : ''}>{i + 1}{'\n'}</span>
          ))}
        </pre>
        <textarea value={text} spellcheck={false} aria-label="Profile YAML" aria-describedby="problems"
          onInput={(e) => setText(e.currentTarget.value)}
          onScroll={(e) => { if (gutter.current) gutter.current.scrollTop = e.currentTarget.scrollTop; }} />
      </div>
      <div id="problems" class="problems" aria-live="polite" data-testid="problems">
        {problems.length === 0 ? <p class="ok">The document is valid against the StorageProfile schema.</p> : (
          <ul>
            {problems.map((p, i) => (
              <li key={i} data-line={p.line} data-field={p.field}>
                <span class="line">line {p.line}</span> <code>{p.field}</code>: {p.message}
                <span class="muted"> ({p.source})</span>
              </li>
            ))}
          </ul>
        )}
      </div>
      <div class="toolbar">
        <button type="button" onClick={() => send(true)} disabled={server.busy || checked.problems.length > 0}>Plan (dry run)</button>
        <button type="button" onClick={() => send(false)} disabled={server.busy || checked.problems.length > 0}>
          {creating ? 'Create' : 'Save'}
        </button>
        {!creating && <a href={href(['profiles', name])}>Discard</a>}
      </div>
      {server.error && !server.causes.length && <ErrorBox error={server.error} />}
      {server.plans && <Section title="What each host would do" id="dry-run"><Plans plans={server.plans} /></Section>}
    </div>
  );
}

function SelectedHosts({ profile }) {
  const selector = selectorText(profile.spec.hostSelector);
  const hosts = usePoll(selector ? 'hosts' : null, { query: { labelSelector: selector, limit: 200 }, interval: 10000, enabled: Boolean(selector) });
  if (!selector) return <p class="muted">No host selector: the control plane applies it to no host.</p>;
  const items = (hosts.data && hosts.data.items) || [];
  const more = hosts.data && hosts.data.metadata.remainingItemCount;
  return (
    <div>
      <p class="muted">Selector <code>{selector}</code>{hosts.data ? `: ${items.length + (more || 0)} host(s)` : ''}</p>
      <ErrorBox error={hosts.error} />
      <ul class="plain columns" data-testid="selected-hosts">
        {items.map((h) => (
          <li key={h.metadata.name}>
            <a href={href(['hosts', h.metadata.name])}>{h.metadata.name}</a>{' '}
            <span class="muted">{h.status.appliedGenerations[profile.metadata.name] !== undefined ? `gen ${h.status.appliedGenerations[profile.metadata.name]}` : 'not applied'}</span>
          </li>
        ))}
      </ul>
      {more ? <p class="muted"><a href={href(['fleet'], { selector })}>and {more} more on the fleet page</a></p> : null}
    </div>
  );
}

function DeleteProfile({ name }) {
  const [state, setState] = useState(null);
  async function step(dryRun) {
    try {
      const { data } = await api(`profiles/${encodeURIComponent(name)}`, { method: 'DELETE', query: dryRun ? { dryRun: 'All' } : undefined });
      if (dryRun) setState({ plans: data.plans });
      else go(['profiles']);
    } catch (e) {
      setState({ error: e });
    }
  }
  return (
    <div>
      <button type="button" onClick={() => step(true)}>Delete…</button>
      {state && state.plans && (
        <div role="dialog" aria-label="Confirm deletion">
          <p>Deleting puts these settings back on each host first:</p>
          <Plans plans={state.plans} />
          <button type="button" class="danger" onClick={() => step(false)}>Delete {name}</button>{' '}
          <button type="button" onClick={() => setState(null)}>Keep it</button>
        </div>
      )}
      {state && <ErrorBox error={state.error} />}
    </div>
  );
}

function ProfileView({ name, mode }) {
  const profile = useFetch(`profiles/${encodeURIComponent(name)}`);
  const canWrite = useCan(WRITE.profiles);
  const p = profile.data;
  if (profile.error) return <ErrorBox error={profile.error} />;
  if (!p) return <p class="muted">Loading…</p>;
  const yaml = stringify(documentOf(p));
  if (mode === 'edit' && canWrite) {
    return (
      <div>
        <h1>Edit {name}</h1>
        <Editor name={name} initial={yaml} resourceVersion={p.metadata.resourceVersion} />
      </div>
    );
  }
  return (
    <div>
      <h1>{name}</h1>
      <Section title="Document" id="yaml" actions={canWrite && (
        <span class="actions" data-write="profiles">
          <a class="button" href={href(['profiles', name, 'edit'])}>Edit</a>
          <DeleteProfile name={name} />
        </span>)}>
        <p class="muted">generation {p.metadata.generation}, resourceVersion {p.metadata.resourceVersion}, created {when(p.metadata.creationTimestamp)}</p>
        <pre class="yaml" data-testid="yaml">{yaml}</pre>
      </Section>
      <RolloutSection name={name} />
      <Section title="Hosts it selects" id="hosts"><SelectedHosts profile={p} /></Section>
    </div>
  );
}

export function ProfilesPage({ name, mode }) {
  const list = usePoll(name ? null : 'profiles', { interval: 10000, enabled: !name });
  const canWrite = useCan(WRITE.profiles);
  if (name === NEW) {
    return canWrite ? (
      <div><h1>New profile</h1><Editor name={NEW} initial={TEMPLATE} /></div>
    ) : <p>Your token's role may not write profiles.</p>;
  }
  if (name) return <ProfileView name={name} mode={mode} />;
  const items = (list.data && list.data.items) || [];
  return (
    <div>
      <h1>Profiles</h1>
      {canWrite && <p data-write="profiles"><a class="button" href={href(['profiles', NEW])}>New profile</a></p>}
      <ErrorBox error={list.error} />
      <div class="scroll">
        <table>
          <thead><tr><th scope="col">Profile</th><th scope="col">Mode</th><th scope="col">Priority</th><th scope="col">Generation</th>
            <th scope="col">Host selector</th><th scope="col">Labels</th></tr></thead>
          <tbody>
            {!list.loaded && <Placeholder columns={6} />}
            {list.loaded && !items.length && <Empty columns={6}>No profiles yet.</Empty>}
            {items.map((p) => (
              <tr key={p.metadata.name}>
                <td><a href={href(['profiles', p.metadata.name])}>{p.metadata.name}</a></td>
                <td>{p.spec.mode}</td>
                <td class="num">{p.spec.priority}</td>
                <td class="num">{p.metadata.generation}</td>
                <td><code>{selectorText(p.spec.hostSelector) || '–'}</code></td>
                <td><Labels labels={p.metadata.labels} /></td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </div>
  );
}
