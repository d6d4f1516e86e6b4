// Tuning experiments: live progress per host, the response curves, the recommendation, and the
// recommended profile to download or apply.
// CLI: stortune tune list | show ID | profile ID [-o FILE] [--apply]; the same calls:
// GET /api/v1/experiments, GET .../{id}, GET .../{id}/profile, POST|PUT /api/v1/profiles.
import { useState } from 'preact/hooks';
import { api, apiUrl, ApiError } from '../api.js';
import { Empty, ErrorBox, Placeholder, Section, useCan, WRITE } from '../components.jsx';
import { metric as showMetric, pct, when } from '../format.js';
import { usePoll } from '../hooks.js';
import { href } from '../router.js';
import { Chart } from '../chart.jsx';

const ENDED = new Set(['done', 'failed', 'cancelled']);

const describe = (point) => Object.entries(point || {}).map(([k, v]) => `${k}=${v}`).join(', ');

export function ExperimentsPage() {
  const list = usePoll('experiments', { query: { limit: 200 }, interval: 5000 });
  const items = (list.data && list.data.items) || [];
  return (
    <div>
      <h1>Tuning experiments</h1>
      <ErrorBox error={list.error} />
      <div class="scroll">
        <table>
          <thead><tr><th scope="col">Experiment</th><th scope="col">Id</th><th scope="col">State</th>
            <th scope="col">Hosts</th><th scope="col">Recommendation</th><th scope="col">Started</th></tr></thead>
          <tbody>
            {!list.loaded && <Placeholder columns={6} />}
            {list.loaded && !items.length && <Empty columns={6}>No experiments yet.</Empty>}
            {items.map((x) => {
              const rec = x.status.outcome && x.status.outcome.recommendation;
              return (
                <tr key={x.metadata.uid}>
                  <td><a href={href(['experiments', x.metadata.uid])}>{x.metadata.name}</a></td>
                  <td class="muted">{x.metadata.uid}</td>
                  <td>{x.status.state}</td>
                  <td>{x.status.hosts.map((h) => h.host).join(', ')}</td>
                  <td>{rec ? (rec.keepCurrent ? 'keep the current settings' : describe(rec.values)) : '–'}</td>
                  <td>{when(x.status.startedAt)}</td>
                </tr>
              );
            })}
          </tbody>
        </table>
      </div>
    </div>
  );
}

function trialsOf(outcome) {
  if (!outcome) return [];
  if (outcome.trials) return outcome.trials;
  const first = outcome.perHost && Object.values(outcome.perHost)[0];
  return (first && first.trials) || [];
}

function ResponseCurves({ outcome, parameters }) {
  const trials = trialsOf(outcome).filter((t) => t.mean !== null && t.mean !== undefined);
  const rec = (outcome && outcome.recommendation && outcome.recommendation.values) || {};
  const metric = outcome.metric;
  return parameters.map((p) => {
    const key = p.key || p.tunable;
    const others = (t) => Object.entries(t.point).every(([k, v]) => k === key || rec[k] === undefined || rec[k] === v);
    const chosen = trials.filter(others).length ? trials.filter(others) : trials;
    const values = [...new Set([...(p.values || []), ...chosen.map((t) => t.point[key])])].filter((v) => chosen.some((t) => t.point[key] === v));
    const at = (v) => chosen.find((t) => t.point[key] === v);
    return (
      <Chart key={key} testid={`response-${key}`} title={`${metric} against ${key}`}
        x={values.map((_, i) => i)} xLabels={values.map((v) => `${v}${rec[key] === v ? ' (recommended)' : ''}`)}
        series={[
          { label: 'mean', values: values.map((v) => at(v).mean) },
          { label: '95% low', values: values.map((v) => at(v).ci95_low ?? null), color: '#9ca3af' },
          { label: '95% high', values: values.map((v) => at(v).ci95_high ?? null), color: '#9ca3af' },
        ]}
        xLabel={key} yLabel={metric} format={(v) => showMetric(metric, v)} />
    );
  });
}

function ApplyProfile({ id }) {
  const [state, setState] = useState(null);
  async function apply() {
    setState({ busy: true });
    try {
      const { data: profile } = await api(`experiments/${encodeURIComponent(id)}/profile`, { query: { format: 'json' } });
      const name = profile.metadata.name;
      try {
        await api('profiles', { method: 'POST', body: profile });
      } catch (e) {
        if (!(e instanceof ApiError) || e.status !== 409) throw e;
        await api(`profiles/${encodeURIComponent(name)}`, { method: 'PUT', body: profile });
      }
      setState({ done: name });
    } catch (e) {
      setState({ error: e });
    }
  }
  return (
    <span>
      <button type="button" data-write="profiles" onClick={apply} disabled={state && state.busy}>Apply the profile</button>
      {state && state.done && <span role="status"> stored as <a href={href(['profiles', state.done])}>{state.done}</a></span>}
      {state && <ErrorBox error={state.error} />}
    </span>
  );
}

export function ExperimentPage({ id }) {
  const [ended, setEnded] = useState(false);
  const exp = usePoll(`experiments/${encodeURIComponent(id)}`, { interval: ended ? 0 : 2000 });
  const canApply = useCan(WRITE.profiles);
  const canRun = useCan(WRITE.experiments);
  const [cancelError, setCancelError] = useState(null);
  const x = exp.data;
  if (x && ENDED.has(x.status.state) && !ended) setEnded(true);
  const outcome = x && x.status.outcome;
  const rec = outcome && outcome.recommendation;
  const profileUrl = apiUrl(`experiments/${encodeURIComponent(id)}/profile`, { format: 'yaml' }).href;
  return (
    <div data-experiment={id}>
      <h1>Experiment {x ? x.metadata.name : id}</h1>
      <ErrorBox error={exp.error} />
      {x && (
        <>
          <Section title="Progress" id="progress" actions={canRun && !ENDED.has(x.status.state) && (
            <button type="button" data-write="experiments" onClick={async () => {
              try { await api(`experiments/${encodeURIComponent(id)}/cancel`, { method: 'POST' }); exp.refresh(); } catch (e) { setCancelError(e); }
            }}>Cancel</button>)}>
            <ErrorBox error={cancelError} />
            <p data-testid="experiment-state">{x.status.state}{x.status.reason ? `: ${x.status.reason}` : ''}</p>
            <ul class="plain">
              {x.status.hosts.map((h) => {
                const p = h.progress || {};
                return (
                  <li key={h.host}>
                    <a href={href(['hosts', h.host])}>{h.host}</a> {h.state}{h.device ? ` on ${h.device}` : ''}
                    {p.trial ? ` · trial ${p.trial} of ~${p.total}` : ''}
                    {p.testingText ? ` · testing ${p.testingText} (${p.purpose})` : ''}
                    {p.last && p.last.value !== undefined ? ` · last ${describe(p.last.point)}: ${showMetric(p.metric, p.last.value)}` : ''}
                    {p.leader ? ` · leader ${describe(p.leader)} ${showMetric(p.metric, p.leaderMean)}${p.marginPct !== null && p.marginPct !== undefined ? ` (${pct(p.marginPct)} vs runner-up)` : ''}` : ''}
                    {h.message ? <span class="muted"> {h.message}</span> : null}
                  </li>
                );
              })}
            </ul>
          </Section>
          {rec && (
            <Section title="Recommendation" id="recommendation" actions={
              <span class="actions">
                <a class="button" href={profileUrl} download={`${x.metadata.name}.yaml`}>Download the profile</a>
                {canApply && <ApplyProfile id={id} />}
              </span>}>
              <p data-testid="recommendation">
                {rec.keepCurrent ? 'Keep the current settings. ' : `Set ${describe(rec.values)}. `}
                {rec.gain ? `Gain ${pct(rec.gain.pct)} (95% interval ${pct(rec.gain.low)} .. ${pct(rec.gain.high)}), ${rec.significant ? 'significant' : 'not significant'}. ` : ''}
                {rec.reason}
              </p>
              {outcome.baseline && <p class="muted">Baseline: {outcome.baseline.reliable ? 'held' : 'UNRELIABLE'} ({outcome.baseline.reason})</p>}
            </Section>
          )}
          {outcome && (
            <Section title="Response curves" id="curves">
              <ResponseCurves outcome={outcome} parameters={x.spec.parameters || []} />
            </Section>
          )}
          {x.status.trials && (
            <Section title="Trials" id="trials">
              <div class="scroll">
                <table>
                  <thead><tr><th scope="col">#</th><th scope="col">Host</th><th scope="col">Values</th><th scope="col">Purpose</th>
                    <th scope="col">State</th><th scope="col">Run</th></tr></thead>
                  <tbody>
                    {x.status.trials.map((t) => (
                      <tr key={`${t.host}/${t.index}`}>
                        <td class="num">{t.index + 1}</td><td>{t.host}</td><td>{describe(t.point)}</td><td>{t.purpose}</td>
                        <td>{t.state}</td><td><a href={href(['benchmarks', t.runId])}>{t.runId}</a></td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            </Section>
          )}
        </>
      )}
    </div>
  );
}
