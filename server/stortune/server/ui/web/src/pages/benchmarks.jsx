// Benchmark runs with their verdicts; a run's result with interactive charts; two runs compared
// against the noise, with what changed between them first.
// CLI: stortune bench list | show ID | compare A B; the same calls: GET /api/v1/benchmarks/runs,
// GET .../runs/{id}, GET /api/v1/benchmarks/compare?a=&b=.
import { useState } from 'preact/hooks';
import { api } from '../api.js';
import { Empty, ErrorBox, Placeholder, Section, useCan, WRITE } from '../components.jsx';
import { metric as showMetric, pct, si, when } from '../format.js';
import { useFetch, usePoll } from '../hooks.js';
import { go, href } from '../router.js';
import { Chart } from '../chart.jsx';

const ENDED = new Set(['done', 'failed', 'cancelled']);

function Verdict({ run }) {
  const passed = run.status.passed;
  if (passed === true) return <span class="badge badge-good">passed</span>;
  if (passed === false) return <span class="badge badge-bad">failed thresholds</span>;
  return <span class="muted">no thresholds</span>;
}

export function BenchmarksPage({ query }) {
  const host = query.get('host') || undefined;
  const runs = usePoll('benchmarks/runs', { query: { host, limit: 200 }, interval: 5000 });
  const [picked, setPicked] = useState([]);
  function toggle(id) {
    setPicked(picked.includes(id) ? picked.filter((p) => p !== id) : [...picked.slice(-1), id]);
  }
  const items = (runs.data && runs.data.items) || [];
  return (
    <div>
      <h1>Benchmarks</h1>
      <p class="muted">Pick two finished runs to compare them (A first). CLI: stortune bench list, stortune bench compare A B.</p>
      <div class="toolbar">
        <button type="button" disabled={picked.length !== 2} onClick={() => go(['compare', picked[0], picked[1]])}>
          Compare {picked.length === 2 ? `${picked[0]} → ${picked[1]}` : 'two runs'}
        </button>
      </div>
      <ErrorBox error={runs.error} />
      <div class="scroll">
        <table>
          <thead>
            <tr><th scope="col">Compare</th><th scope="col">Run</th><th scope="col">Benchmark</th><th scope="col">Host</th>
              <th scope="col">State</th><th scope="col">Verdict</th><th scope="col">Finished</th></tr>
          </thead>
          <tbody>
            {!runs.loaded && <Placeholder columns={7} />}
            {runs.loaded && !items.length && <Empty columns={7}>No runs yet.</Empty>}
            {items.map((r) => (
              <tr key={r.metadata.name} data-run={r.metadata.name}>
                <td>
                  <input type="checkbox" aria-label={`Compare ${r.metadata.name}`} disabled={r.status.state !== 'done'}
                    checked={picked.includes(r.metadata.name)} onChange={() => toggle(r.metadata.name)} />
                </td>
                <td><a href={href(['benchmarks', r.metadata.name])}>{r.metadata.name}</a></td>
                <td>{r.spec.benchmark.metadata.name}</td>
                <td><a href={href(['hosts', r.spec.host])}>{r.spec.host}</a></td>
                <td>{r.status.state}{r.status.state === 'running' && r.status.progress.percent !== undefined ? ` ${Math.round(r.status.progress.percent)}%` : ''}</td>
                <td><Verdict run={r} /></td>
                <td>{when(r.status.finishedAt)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </div>
  );
}

// -- one run -----------------------------------------------------------------------------------

const THROUGHPUT = {
  total_bandwidth: 'bandwidth (read + write)', read_bandwidth: 'read bandwidth', write_bandwidth: 'write bandwidth',
  total_iops: 'IOPS (read + write)', read_iops: 'read IOPS', write_iops: 'write IOPS',
};
const PERCENTILES = ['p50', 'p95', 'p99', 'p999'];

function means(result) {
  return new Map((result.summaries || []).map((s) => [s.step, Object.fromEntries(
    Object.entries(s.metrics).map(([k, v]) => [k, v.mean]))]));
}

function ThroughputChart({ result }) {
  const [chosen, setChosen] = useState('total_bandwidth');
  const m = means(result);
  const steps = result.steps || [];
  const xs = [...new Set(steps.map((s) => s.numjobs))].sort((a, b) => a - b);
  const groups = new Map();
  for (const step of steps) {
    const key = `${step.workload} ${step.phase || step.pattern}`;
    if (!groups.has(key)) groups.set(key, new Map());
    const value = (m.get(step.name) || {})[chosen];
    if (value !== undefined) groups.get(key).set(step.numjobs, value);
  }
  const series = [...groups.entries()].filter(([, byX]) => byX.size)
    .map(([label, byX]) => ({ label, values: xs.map((x) => (byX.has(x) ? byX.get(x) : null)) }));
  return (
    <div>
      <label class="inline">
        Metric{' '}
        <select value={chosen} onChange={(e) => setChosen(e.currentTarget.value)} aria-label="Throughput metric">
          {Object.entries(THROUGHPUT).map(([k, v]) => <option key={k} value={k}>{v}</option>)}
        </select>
      </label>
      {series.length ? (
        <Chart title={`${THROUGHPUT[chosen]} against threads`} testid="throughput" x={xs.map((_, i) => i)}
          xLabels={xs.map(String)} series={series}
          xLabel="threads (fio numjobs)" yLabel={THROUGHPUT[chosen]} format={(v) => showMetric(chosen, v)} />
      ) : <p class="muted">No step measured {THROUGHPUT[chosen]}.</p>}
    </div>
  );
}

function LatencyChart({ result }) {
  const m = means(result);
  const steps = (result.steps || []).filter((s) => m.has(s.name));
  const direction = (name) => (((m.get(name) || {}).read_lat_p50 || 0) > 0 ? 'read' : 'write');
  const series = PERCENTILES.map((p) => ({
    label: p === 'p999' ? 'p99.9' : p,
    values: steps.map((s) => {
      const v = (m.get(s.name) || {})[`${direction(s.name)}_lat_${p}`];
      return v && v > 0 ? v : null;
    }),
  })).filter((s) => s.values.some((v) => v !== null));
  if (!series.length) return <p class="muted">No latency percentiles in this run.</p>;
  return (
    <Chart title="Completion latency percentiles per step (log scale)" testid="latency" x={steps.map((_, i) => i)}
      xLabels={steps.map((s) => `${s.name} (${direction(s.name)})`)} series={series} log
      xLabel="step" yLabel="latency" format={(v) => showMetric('read_lat_p50', v)} />
  );
}

function UtilisationChart({ result }) {
  const stepNames = [...new Set((result.runs || []).filter((r) => r.devices && r.devices.length).map((r) => r.step))];
  const [step, setStep] = useState(stepNames[0]);
  if (!stepNames.length) return <p class="muted">No per-device figures in this run.</p>;
  const current = stepNames.includes(step) ? step : stepNames[0];
  const perDevice = new Map();
  for (const run of (result.runs || []).filter((r) => r.step === current)) {
    for (const d of run.devices) {
      const entry = perDevice.get(d.device) || { sum: 0, n: 0, slowest: false, relation: d.relation };
      entry.sum += d.util_percent || 0;
      entry.n += 1;
      entry.slowest = entry.slowest || d.slowest;
      perDevice.set(d.device, entry);
    }
  }
  const devices = [...perDevice.keys()];
  const util = devices.map((d) => perDevice.get(d).sum / perDevice.get(d).n);
  const slowest = devices.filter((d) => perDevice.get(d).slowest);
  const series = [
    { label: 'utilisation %', values: util.map((v, i) => (perDevice.get(devices[i]).slowest ? null : v)), bars: true, color: '#2563eb' },
    { label: 'slowest member', values: util.map((v, i) => (perDevice.get(devices[i]).slowest ? v : null)), bars: true, color: '#dc2626' },
  ];
  return (
    <div>
      <label class="inline">
        Step{' '}
        <select value={current} onChange={(e) => setStep(e.currentTarget.value)} aria-label="Step for device utilisation">
          {stepNames.map((s) => <option key={s} value={s}>{s}</option>)}
        </select>
      </label>
      <Chart title={`Device utilisation during ${current}`} testid="utilisation" x={devices.map((_, i) => i)}
        xLabels={devices.map((d) => `${d} (${perDevice.get(d).relation})${perDevice.get(d).slowest ? ' ★ slowest' : ''}`)}
        series={series} xLabel="device" yLabel="% of the step busy" format={(v) => `${v.toFixed(0)}%`} />
      <p class="muted small" data-testid="slowest">
        {slowest.length ? `Slowest member: ${slowest.join(', ')} (await or utilisation 1.5 × its peers' median)` : 'No member stands out.'}
      </p>
    </div>
  );
}

function StepTable({ result }) {
  const objective = ['read_bandwidth', 'write_bandwidth', 'read_iops', 'write_iops', 'read_lat_p99', 'write_lat_p99'];
  return (
    <div class="scroll">
      <table>
        <thead>
          <tr><th scope="col">Step</th><th scope="col">Runs</th>
            {objective.map((k) => <th scope="col" key={k}>{k}</th>)}</tr>
        </thead>
        <tbody>
          {(result.summaries || []).map((s) => (
            <tr key={s.step}>
              <td>{s.step}</td>
              <td class="num">{s.runs}</td>
              {objective.map((k) => {
                const v = s.metrics[k];
                return (
                  <td key={k} class={`num${v && v.noisy ? ' noisy' : ''}`} title={v && v.noisy ? `noisy: CV ${(v.cv * 100).toFixed(1)}%` : ''}>
                    {v && v.mean ? `${showMetric(k, v.mean)} ± ${showMetric(k, v.stdev)}` : '–'}
                  </td>
                );
              })}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function CancelButton({ id, onDone }) {
  const [error, setError] = useState(null);
  return (
    <>
      <button type="button" data-write="benchmarks" onClick={async () => {
        try {
          await api(`benchmarks/runs/${encodeURIComponent(id)}/cancel`, { method: 'POST' });
          onDone();
        } catch (e) {
          setError(e);
        }
      }}>Cancel run</button>
      <ErrorBox error={error} />
    </>
  );
}

export function RunPage({ id }) {
  const [live, setLive] = useState(true);
  const run = usePoll(`benchmarks/runs/${encodeURIComponent(id)}`, { interval: live ? 2000 : 0 });
  const canRun = useCan(WRITE.benchmarks);
  const doc = run.data;
  if (doc && ENDED.has(doc.status.state) && live) setLive(false);
  const others = useFetch(doc ? 'benchmarks/runs' : null, doc ? { name: doc.spec.benchmark.metadata.name, state: 'done', limit: 50 } : undefined);
  const result = doc && doc.status.result;
  return (
    <div data-run={id}>
      <h1>Run {id}</h1>
      <ErrorBox error={run.error} />
      {!doc && !run.error && <p class="muted">Loading…</p>}
      {doc && (
        <>
          <Section title={doc.spec.benchmark.metadata.name} id="run" actions={canRun && !ENDED.has(doc.status.state) && <CancelButton id={id} onDone={run.refresh} />}>
            <dl class="facts">
              <div><dt>Host</dt><dd><a href={href(['hosts', doc.spec.host])}>{doc.spec.host}</a></dd></div>
              <div><dt>State</dt><dd data-testid="run-state">{doc.status.state}{doc.status.message ? `: ${doc.status.message}` : ''}</dd></div>
              <div><dt>Verdict</dt><dd><Verdict run={doc} /></dd></div>
              <div><dt>Progress</dt><dd>{doc.status.progress && doc.status.progress.percent !== undefined ? `${Math.round(doc.status.progress.percent)}% ${doc.status.progress.step || ''}` : '–'}</dd></div>
              <div><dt>Kernel</dt><dd>{doc.status.context.kernel || '–'}</dd></div>
              <div><dt>Profiles</dt><dd>{Object.entries(doc.status.context.profiles || {}).map(([p, g]) => `${p}: ${g}`).join(', ') || 'none'}</dd></div>
              <div><dt>Asked by</dt><dd>{doc.spec.requestedBy}</dd></div>
              <div><dt>Finished</dt><dd>{when(doc.status.finishedAt)}</dd></div>
            </dl>
            {others.data && (
              <label class="inline">
                Compare with{' '}
                <select aria-label="Compare with run" onChange={(e) => e.currentTarget.value && go(['compare', e.currentTarget.value, id])}>
                  <option value="">another run of {doc.spec.benchmark.metadata.name}…</option>
                  {others.data.items.filter((r) => r.metadata.name !== id).map((r) => (
                    <option key={r.metadata.name} value={r.metadata.name}>{r.metadata.name} on {r.spec.host}</option>
                  ))}
                </select>
              </label>
            )}
          </Section>
          {result && (
            <>
              <Section title="Throughput against threads" id="throughput"><ThroughputChart result={result} /></Section>
              <Section title="Latency percentiles" id="latency"><LatencyChart result={result} /></Section>
              <Section title="Per-device utilisation" id="utilisation"><UtilisationChart result={result} /></Section>
              <Section title="Steps (mean ± stdev over repeats)" id="steps"><StepTable result={result} /></Section>
              {result.verdict && (
                <Section title="Thresholds" id="thresholds">
                  <ul class="plain">{result.verdict.outcomes.map((o, i) => <li key={i} class={o.passed ? '' : 'row-bad'}>{o.passed ? '✓ ' : '✗ '}{o.message}</li>)}</ul>
                </Section>
              )}
              {(result.bottlenecks || []).length > 0 && (
                <Section title="Bottlenecks" id="bottlenecks">
                  <ul class="plain">{result.bottlenecks.map((b, i) => <li key={i}>{b.step}: {b.summary}</li>)}</ul>
                </Section>
              )}
            </>
          )}
        </>
      )}
    </div>
  );
}

// -- two runs ----------------------------------------------------------------------------------

export function ComparePage({ a, b }) {
  const cmp = useFetch(`benchmarks/compare`, { a, b });
  const [all, setAll] = useState(false);
  const data = cmp.data;
  const rows = data ? data.rows.filter((r) => all || r.objective) : [];
  const chartRows = data ? data.rows.filter((r) => r.objective && r.deltaPct !== null) : [];
  return (
    <div>
      <h1>Compare {a} → {b}</h1>
      <p class="muted">CLI: stortune bench compare {a} {b}</p>
      <ErrorBox error={cmp.error} />
      {!data && !cmp.error && <p class="muted">Loading…</p>}
      {data && (
        <>
          <Section title="What changed between them" id="changes">
            {data.contextChanges.length ? (
              <ul class="changes" data-testid="context-changes">{data.contextChanges.map((c, i) => <li key={i}><code>{c}</code></li>)}</ul>
            ) : <p data-testid="context-changes">Nothing recorded changed: same settings, profile generations, kernel and fio.</p>}
            <p class="muted">
              A: <a href={href(['benchmarks', data.a.id])}>{data.a.id}</a> on {data.a.host} · B: <a href={href(['benchmarks', data.b.id])}>{data.b.id}</a> on {data.b.host} ·{' '}
              {data.summary.better} better, {data.summary.worse} worse, {data.summary.withinNoise} within noise
              {data.summary.objectiveWorse ? `, ${data.summary.objectiveWorse} objective regression(s)` : ''}
            </p>
          </Section>
          {chartRows.length > 0 && (
            <Section title="Change against the noise" id="change-chart">
              <Chart title="Change of each objective metric (bars) and the noise interval" testid="compare"
                x={chartRows.map((_, i) => i)} xLabels={chartRows.map((r) => `${r.step} ${r.metric}`)}
                series={[
                  { label: 'change %', values: chartRows.map((r) => r.deltaPct), bars: true },
                  { label: 'noise low %', values: chartRows.map((r) => r.noiseLowPct), color: '#6b7280' },
                  { label: 'noise high %', values: chartRows.map((r) => r.noiseHighPct), color: '#6b7280' },
                ]}
                xLabel="step and metric" yLabel="% against A" format={(v) => pct(v)} />
            </Section>
          )}
          <Section title="Metrics" id="metrics" actions={
            <label class="inline"><input type="checkbox" checked={all} onChange={() => setAll(!all)} /> all metrics</label>}>
            <div class="scroll">
              <table>
                <thead>
                  <tr><th scope="col">Step</th><th scope="col">Metric</th><th scope="col">A</th><th scope="col">B</th>
                    <th scope="col">Change</th><th scope="col">Noise</th><th scope="col">Verdict</th></tr>
                </thead>
                <tbody>
                  {rows.map((r) => (
                    <tr key={`${r.step}/${r.metric}`} class={r.verdict === 'worse' ? 'row-bad' : r.verdict === 'better' ? 'row-good' : ''}>
                      <td>{r.step}</td>
                      <td>{r.metric}{r.objective ? ' ●' : ''}</td>
                      <td class="num">{showMetric(r.metric, r.a.mean)} ± {showMetric(r.metric, r.a.stdev)}</td>
                      <td class="num">{showMetric(r.metric, r.b.mean)} ± {showMetric(r.metric, r.b.stdev)}</td>
                      <td class="num">{pct(r.deltaPct)}</td>
                      <td class="num">{r.noiseLowPct === null ? '–' : `${pct(r.noiseLowPct)} .. ${pct(r.noiseHighPct)}`}</td>
                      <td>{r.verdict}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
            <p class="muted small">● an objective metric of its step (what comparisons gate on). {si(rows.length)} rows.</p>
          </Section>
        </>
      )}
    </div>
  );
}
