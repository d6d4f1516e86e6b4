// A profile's rollout (issue 27), on the profile's page: its phase and why, the open wave, each
// wave's hosts per stage, the failed hosts with why, the canaries' analysis with links to their
// runs, and Pause / Resume / Undo for a role that may write profiles (the API decides: the
// buttons follow its permission names, a viewer sees none).
// CLI: stortune rollout status PROFILE; stortune rollout pause|resume|undo PROFILE.
import { useState } from 'preact/hooks';
import { api } from '../api.js';
import { ErrorBox, Section, useCan, WRITE } from '../components.jsx';
import { when } from '../format.js';
import { usePoll } from '../hooks.js';
import { href } from '../router.js';

// The machine's host stages in the order a host goes through them (stages the server adds later
// are shown after these, as it names them).
const STAGES = ['pending', 'baseline', 'changing', 'analysing', 'updated', 'failed', 'reverting', 'reverted'];
const BAD_STAGES = new Set(['failed', 'reverting', 'reverted']);
const TONE = { Progressing: 'unknown', Paused: 'unknown', Halted: 'bad', Complete: 'good' };
const REASONS = {
  FailureLimit: 'more hosts failed than maxFailures allows',
  AnalysisFailed: "a canary's analysis judged the change worse than its before-run",
  Undone: 'undone on request',
};

function stagesOf(waves) {
  const seen = new Set(STAGES);
  const extra = [];
  for (const w of waves) for (const s of Object.keys(w.stages || {})) if (!seen.has(s)) { seen.add(s); extra.push(s); }
  return [...STAGES, ...extra];
}

/** The commands the machine acts on in this state (schemas/rollout/machine.py _command); any
 * other it ignores with an event. Once reverts were sent (a rollback, an undo) only a new
 * generation of the profile moves the hosts again. */
export function commandsFor(status) {
  const out = [];
  if (status.phase === 'Progressing') out.push('pause');
  if (status.phase === 'Paused' || (status.phase === 'Halted' && !status.rollback)) out.push('resume');
  if (!status.rollback) out.push('undo');
  return out;
}

function Steer({ name, status, onDone }) {
  const [state, setState] = useState({ busy: false, error: null, confirm: false, sent: null });
  async function send(command) {
    setState({ busy: true, error: null, confirm: false, sent: null });
    try {
      await api(`profiles/${encodeURIComponent(name)}/rollout/${command}`, { method: 'POST' });
      setState({ busy: false, error: null, confirm: false, sent: command });
      onDone();
    } catch (e) {
      setState({ busy: false, error: e, confirm: false, sent: null });
    }
  }
  const allowed = commandsFor(status);
  const label = { pause: 'Pause', resume: 'Resume', undo: 'Undo…' };
  return (
    <span class="actions" data-write="profiles" data-testid="rollout-actions">
      {allowed.map((c) => (
        <button type="button" key={c} class={c === 'undo' ? 'danger' : undefined} disabled={state.busy}
          onClick={() => (c === 'undo' ? setState({ ...state, confirm: true }) : send(c))}>{label[c]}</button>
      ))}
      {state.confirm && (
        <div role="dialog" aria-label="Confirm undo" class="confirm">
          <p>
            Undo puts every host this rollout changed back on generation {status.previous}
            {status.previous ? '' : ' (nothing of the profile)'}; the profile itself keeps generation {status.generation} until you edit it.
          </p>
          <button type="button" class="danger" onClick={() => send('undo')}>Undo the rollout of {name}</button>{' '}
          <button type="button" onClick={() => setState({ ...state, confirm: false })}>Keep it</button>
        </div>
      )}
      {state.sent && <span class="muted" role="status">{state.sent} requested</span>}
      <ErrorBox error={state.error} />
    </span>
  );
}

function Waves({ status }) {
  const waves = status.waves || [];
  const stages = stagesOf(waves);
  return (
    <div class="scroll">
      <table class="waves" data-testid="waves">
        <thead>
          <tr><th scope="col">Wave</th><th scope="col">Hosts</th>
            {stages.map((s) => <th scope="col" key={s} class="num">{s}</th>)}</tr>
        </thead>
        <tbody>
          {waves.map((w) => (
            <tr key={w.number} data-wave={w.number} aria-current={w.number === status.wave ? 'step' : undefined}
              class={w.number === status.wave ? 'open-wave' : undefined}>
              <td>{w.number}{w.number === status.wave && status.phase !== 'Complete' ? ' (open)' : ''}</td>
              <td class="num">{w.hosts}</td>
              {stages.map((s) => {
                const n = (w.stages || {})[s] || 0;
                return <td key={s} class={`num${n && BAD_STAGES.has(s) ? ' bad-n' : ''}`} data-stage={s}>{n}</td>;
              })}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function FailedHosts({ status }) {
  const failed = (status.hosts || []).filter((h) => h.stage === 'failed' || h.failure);
  if (!failed.length) return <p class="muted">No host failed{status.excused ? ` (${status.excused} failure(s) excused by a resume)` : ''}.</p>;
  return (
    <ul class="plain" data-testid="failed-hosts">
      {failed.map((h) => (
        <li key={h.name} class="row-bad" data-host={h.name}>
          <a href={href(['hosts', h.name])}>{h.name}</a> (wave {h.wave}, {h.stage}): {h.failure || 'failed'}
          {h.verdict ? `, analysis ${h.verdict}` : ''}
        </li>
      ))}
    </ul>
  );
}

function RunLink({ id }) {
  if (!id) return <span class="muted">–</span>;
  return <a href={href(['benchmarks', String(id)])}>{String(id)}</a>;
}

function objectiveText(o) {
  if (o === null || typeof o !== 'object') return String(o);
  const name = o.metric || o.name || '';
  const rest = Object.entries(o).filter(([k]) => k !== 'metric' && k !== 'name')
    .map(([k, v]) => `${k} ${typeof v === 'number' ? Math.round(v * 100) / 100 : String(v)}`);
  return `${name}${name && rest.length ? ': ' : ''}${rest.join(', ')}`;
}

function Analysis({ items }) {
  if (!items || !items.length) return <p class="muted">No analysis: the rollout's waves are not gated by one, or no canary has run yet.</p>;
  return (
    <div class="scroll">
      <table data-testid="analysis">
        <thead><tr><th scope="col">Host</th><th scope="col">Verdict</th><th scope="col">Before</th><th scope="col">After</th>
          <th scope="col">Why</th></tr></thead>
        <tbody>
          {items.map((a, i) => (
            <tr key={`${a.host}-${i}`} class={a.verdict === 'failed' ? 'row-bad' : a.verdict === 'passed' ? 'row-good' : undefined}>
              <td>{a.host ? <a href={href(['hosts', String(a.host)])}>{String(a.host)}</a> : '–'}</td>
              <td>{a.verdict ? String(a.verdict) : 'waiting'}</td>
              <td><RunLink id={a.before} />{a.reused ? <span class="muted"> (reused)</span> : null}</td>
              <td>
                <RunLink id={a.after} />
                {a.before && a.after ? <> {' '}<a class="small" href={href(['compare', String(a.before), String(a.after)])}>compare</a></> : null}
              </td>
              <td class="wrap-text">
                {a.reason ? String(a.reason) : ''}
                {Array.isArray(a.objectives) && a.objectives.length > 0 && (
                  <span class="muted">{a.reason ? '; ' : ''}{a.objectives.map(objectiveText).join('; ')}</span>
                )}
                {a.experiment && a.experiment.name ? (
                  <span class="muted"> experiment {String(a.experiment.name)} claimed {String(a.experiment.claimedGain ?? '–')}, measured {String(a.experiment.measuredGainPct ?? '–')}</span>
                ) : null}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function RolloutSection({ name }) {
  const rollout = usePoll(`profiles/${encodeURIComponent(name)}/rollout`, { interval: 3000 });
  const canSteer = useCan(WRITE.profiles);
  const s = rollout.data;
  const none = rollout.error && rollout.error.status === 404;
  let body;
  if (none) body = <p class="muted" data-testid="no-rollout">No rollout: every host takes this profile's generation as it is written.</p>;
  else if (!s) body = rollout.error ? <ErrorBox error={rollout.error} /> : <p class="muted">Loading…</p>;
  else {
    body = (
      <div data-testid="rollout" data-phase={s.phase}>
        <p>
          <span class={`badge badge-${TONE[s.phase] || 'unknown'}`} data-testid="rollout-phase">{s.phase}</span>{' '}
          generation {s.previous} → {s.generation}
          {s.reason ? <> — <strong data-testid="rollout-reason">{s.reason}</strong>: {REASONS[s.reason] || ''}</> : null}
          {s.rollback ? <span class="muted">{s.rolledBack ? ' (rolled back)' : ' (rolling back)'}</span> : null}
        </p>
        {s.rollback && <p class="muted" data-testid="rolled-back">The changed hosts are put back on generation {s.previous}: edit the profile to roll out a new generation.</p>}
        <p class="muted">
          {s.phase === 'Complete' ? `all ${(s.waves || []).length} waves done` : `wave ${s.wave} of ${(s.waves || []).length} open`}
          {`; failures ${s.failures} of at most ${s.maxFailures}`}{s.excused ? ` (${s.excused} excused)` : ''}
          {`; at most ${s.maxUnavailable} host(s) of the open wave changing at once`}
          {s.soakSince ? `; soaking since ${when(s.soakSince)}` : ''}
          {`; started ${when(s.started)}, updated ${when(s.updated)}`}
        </p>
        {(s.pendingCommands || []).length > 0 && (
          <p class="notice" data-testid="pending-commands">
            Waiting for the driver: {s.pendingCommands.map((c) => `${c.command} by ${c.by}`).join(', ')}
          </p>
        )}
        <Waves status={s} />
        <h3>Failed hosts</h3>
        <FailedHosts status={s} />
        {s.hostsTotal > s.hostsListed && <p class="muted small">Hosts listed: the first {s.hostsListed} of {s.hostsTotal} (by wave).</p>}
        <h3>Analysis</h3>
        <Analysis items={s.analysis} />
      </div>
    );
  }
  return (
    <Section title="Rollout" id="rollout" actions={canSteer && s && !none && (
      <Steer name={name} status={s} onDone={rollout.refresh} />)}>
      {body}
    </Section>
  );
}
