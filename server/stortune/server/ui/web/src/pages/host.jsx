// One host: conditions, labels, desired against observed per device and tunable (with the
// profile and rule behind each), the topology tree with layout warnings, the events as a
// timeline, its benchmarks and experiments, and the diagnostics download.
// CLI: stortune describe host NAME; stortune analyze host NAME; stortune get events --host NAME;
// stortune bench list --host NAME; stortune diag NAME.
import { useState } from 'preact/hooks';
import { api, apiUrl } from '../api.js';
import { Badge, Empty, ErrorBox, Labels, Placeholder, Section, useCan, WRITE } from '../components.jsx';
import { condition, since, when } from '../format.js';
import { useFetch, useNow, usePoll } from '../hooks.js';
import { href } from '../router.js';
import { TopologyTree } from '../tree.jsx';
import { CONDITIONS } from './fleet.jsx';

function LabelEditor({ name, labels, onDone }) {
  const [error, setError] = useState(null);
  async function change(patch) {
    setError(null);
    try {
      await api(`hosts/${encodeURIComponent(name)}/labels`, { method: 'PATCH', body: { labels: patch } });
      onDone();
    } catch (e) {
      setError(e);
    }
  }
  function add(event) {
    event.preventDefault();
    const text = event.currentTarget.elements.label.value.trim();
    const at = text.indexOf('=');
    if (at < 1) {
      setError({ message: 'write key=value', causes: [{ field: 'labels', message: `${text}: not key=value` }] });
      return;
    }
    change({ [text.slice(0, at)]: text.slice(at + 1) });
    event.currentTarget.reset();
  }
  return (
    <div class="label-editor" data-write="labels">
      {Object.keys(labels || {}).map((k) => (
        <button type="button" class="small" key={k} onClick={() => change({ [k]: null })} aria-label={`Remove label ${k}`}>
          {k} ✕
        </button>
      ))}
      <form onSubmit={add} class="inline">
        <input name="label" placeholder="key=value" aria-label="New label" size={18} />
        <button type="submit">Set label</button>
      </form>
      <ErrorBox error={error} />
    </div>
  );
}

function Settings({ devices }) {
  return (
    <div class="scroll">
      <table class="settings">
        <thead>
          <tr>
            <th scope="col">Device</th><th scope="col">Tunable</th><th scope="col">Desired</th>
            <th scope="col">Observed</th><th scope="col">In sync</th><th scope="col">Profile / rule</th>
            <th scope="col">Mode</th><th scope="col">Note</th>
          </tr>
        </thead>
        <tbody>
          {devices.length === 0 && <Empty columns={8}>No profile sets anything on this host.</Empty>}
          {devices.map((d) => (
            <tr key={`${d.deviceId}/${d.tunable}`} data-setting={`${d.device}/${d.tunable}`}
              class={d.inSync === false ? 'row-bad' : ''}>
              <td>{d.device}</td>
              <td>{d.tunable}</td>
              <td class="num">{d.desired === null || d.desired === undefined ? '–' : String(d.desired)}</td>
              <td class="num" data-observed>{d.observed === null || d.observed === undefined ? '–' : String(d.observed)}</td>
              <td>{d.inSync === true ? 'yes' : d.inSync === false ? (d.drifted ? 'drifted' : 'no') : '–'}</td>
              <td>{d.profile ? `${d.profile}${d.generation ? ` (gen ${d.generation})` : ''} / ${d.rule || '–'}` : '–'}</td>
              <td>{d.mode || '–'}</td>
              <td class="wrap">{d.pendingReboot ? `pending reboot (now ${d.effective})` : d.message}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function Timeline({ events }) {
  if (!events) return <p class="muted">Loading…</p>;
  if (!events.length) return <p class="muted">No events.</p>;
  return (
    <ol class="timeline" aria-label="Events, newest first">
      {events.map((e, i) => (
        <li key={e.id} class={`ev ev-${(e.type || 'Normal').toLowerCase()}`}>
          <time>{when(e.lastTimestamp || e.firstTimestamp)}</time>
          <strong>{e.reason}</strong>
          {e.count > 1 && <span class="muted"> ×{e.count}</span>}
          <span class="ev-msg">{e.message}</span>
        </li>
      ))}
    </ol>
  );
}

function Runs({ runs }) {
  if (!runs) return <p class="muted">Loading…</p>;
  if (!runs.length) return <p class="muted">No benchmark runs on this host.</p>;
  return (
    <ul class="plain">
      {runs.map((r) => (
        <li key={r.metadata.name}>
          <a href={href(['benchmarks', r.metadata.name])}>{r.spec.benchmark.metadata.name}</a>{' '}
          <span class="muted">{r.metadata.name}</span> {r.status.state}
          {r.status.passed === true && ' · thresholds met'}
          {r.status.passed === false && ' · thresholds failed'} <span class="muted">{when(r.status.finishedAt || r.metadata.creationTimestamp)}</span>
        </li>
      ))}
    </ul>
  );
}

export function HostPage({ name }) {
  const now = useNow(1000);
  const host = usePoll(`hosts/${encodeURIComponent(name)}`, { interval: 3000 });
  const topology = useFetch(`hosts/${encodeURIComponent(name)}/topology`);
  const analysis = useFetch(`hosts/${encodeURIComponent(name)}/analysis`);
  const events = usePoll('events', { query: { host: name, limit: 100 }, interval: 5000 });
  const runs = usePoll('benchmarks/runs', { query: { host: name, limit: 20 }, interval: 10000 });
  const experiments = usePoll('experiments', { query: { limit: 100 }, interval: 10000 });
  const canLabel = useCan(WRITE.labels);
  const canDiag = useCan(WRITE.diagnostics);

  const doc = host.data;
  const checks = [
    ...((analysis.data && analysis.data.checks) || []),
    ...((analysis.data && analysis.data.devices) || []).flatMap((d) => (d.checks || []).map((c) => ({ device: d.device, ...c }))),
  ];
  const warnings = (topology.data && topology.data.warnings) || [];
  const mine = ((experiments.data && experiments.data.items) || []).filter((x) =>
    (x.status.hosts || []).some((h) => h.host === name));
  const drifted = doc && condition(doc, 'Drifted');

  return (
    <div class="host" data-host={name}>
      <h1>{name}</h1>
      <ErrorBox error={host.error} />
      <Section title="Conditions" id="conditions" actions={canDiag && (
        <a class="button" href={apiUrl(`hosts/${encodeURIComponent(name)}/diagnostics`).href} download>
          Download diagnostics
        </a>)}>
        <dl class="facts">
          {CONDITIONS.map((type) => {
            const c = doc && condition(doc, type);
            return (
              <div key={type}>
                <dt><Badge type={type} status={c ? c.status : 'Unknown'} /></dt>
                <dd>{c ? `${c.reason}${c.message ? `: ${c.message}` : ''} (since ${when(c.lastTransitionTime)})` : '–'}</dd>
              </div>
            );
          })}
          <div>
            <dt>Drifted for</dt>
            <dd data-testid="drifted-for">{drifted && drifted.status === 'True' ? since(drifted.lastTransitionTime, now) : 'not drifted'}</dd>
          </div>
          <div>
            <dt>Labels</dt>
            <dd>{doc ? <Labels labels={doc.metadata.labels} /> : '–'}</dd>
          </div>
          <div>
            <dt>Agent</dt>
            <dd>{doc ? `${doc.spec.address}, registered ${when(doc.status.registeredAt)}` : '–'}</dd>
          </div>
          <div>
            <dt>Profile generations</dt>
            <dd>{doc ? Object.entries(doc.status.appliedGenerations).map(([p, g]) => `${p}: ${g}`).join(', ') || 'none' : '–'}</dd>
          </div>
        </dl>
        {canLabel && doc && <LabelEditor name={name} labels={doc.spec.labels} onDone={host.refresh} />}
      </Section>

      <Section title="Settings: desired and observed" id="settings">
        {doc ? <Settings devices={doc.status.devices} /> : <table><tbody><Placeholder columns={8} rows={4} /></tbody></table>}
      </Section>

      <Section title="Topology" id="topology">
        <ErrorBox error={topology.error} />
        {topology.data ? <TopologyTree topology={topology.data} checks={checks} /> : <p class="muted">{topology.loaded ? 'Not reported yet.' : 'Loading…'}</p>}
        {(checks.length > 0 || warnings.length > 0) && (
          <>
            <h3>Layout warnings</h3>
            <ul class="checks">
              {checks.map((c, i) => (
                <li key={`c${i}`} class={`warn-${c.severity}`}>
                  <code>{c.code}</code> {c.device ? `${c.device}: ` : ''}{c.message}
                </li>
              ))}
              {warnings.map((w, i) => <li key={`w${i}`}>{w}</li>)}
            </ul>
          </>
        )}
      </Section>

      <Section title="Events" id="events">
        <ErrorBox error={events.error} />
        <Timeline events={events.data && events.data.items} />
      </Section>

      <Section title="Benchmarks" id="benchmarks">
        <Runs runs={runs.data && runs.data.items} />
      </Section>

      <Section title="Tuning experiments" id="experiments">
        {experiments.loaded && !mine.length && <p class="muted">No experiments on this host.</p>}
        <ul class="plain">
          {mine.map((x) => (
            <li key={x.metadata.uid}>
              <a href={href(['experiments', x.metadata.uid])}>{x.metadata.name}</a> {x.status.state}{' '}
              <span class="muted">{when(x.status.finishedAt || x.status.startedAt)}</span>
            </li>
          ))}
        </ul>
      </Section>
    </div>
  );
}
