// Fleet: every host with its conditions, labels, profile generations and how long it has been
// drifted; filtered by label selector and condition on the server, a page at a time, so ten
// thousand hosts cost the browser one page. Counts come from GET /fleet/summary.
// CLI: stortune get hosts [-l SELECTOR]; the same calls: GET /api/v1/hosts?limit=&continue=
// &labelSelector=&condition=, GET /api/v1/fleet/summary?labelSelector=.
import { useState } from 'preact/hooks';
import { Badge, Empty, ErrorBox, Labels, Placeholder } from '../components.jsx';
import { condition, since } from '../format.js';
import { useNow, usePoll } from '../hooks.js';
import { go, href } from '../router.js';

export const CONDITIONS = ['Ready', 'Drifted', 'Applied', 'Reachable'];
const STATUSES = ['True', 'False', 'Unknown'];
const PAGE_SIZES = [50, 100, 200, 500];
const COLUMNS = 8;

function Counts({ summary, wanted, selector }) {
  // Fixed boxes with their numbers in tabular figures: a count that changes moves nothing.
  const total = summary ? summary.hosts : null;
  return (
    <div class="counts" aria-live="polite" data-testid="counts">
      <a class="count" href={href(['fleet'], { selector })} data-count="hosts">
        <span class="count-n">{total === null ? '–' : total}</span>
        <span class="count-l">hosts</span>
      </a>
      {[['Ready', 'False', 'not ready'], ['Drifted', 'True', 'drifted'], ['Applied', 'False', 'not applied'],
        ['Reachable', 'False', 'unreachable']].map(([type, status, label]) => {
        const n = summary && summary.conditions[type] ? summary.conditions[type][status] || 0 : null;
        const filter = `${type}=${status}`;
        return (
          <a key={filter} class={`count${n ? ' count-bad' : ''}${wanted.includes(filter) ? ' count-on' : ''}`}
            href={href(['fleet'], { selector, condition: filter })} data-count={filter}>
            <span class="count-n">{n === null ? '–' : n}</span>
            <span class="count-l">{label}</span>
          </a>
        );
      })}
    </div>
  );
}

function Generations({ generations }) {
  const entries = Object.entries(generations || {});
  if (!entries.length) return <span class="muted">none</span>;
  return entries.map(([profile, gen]) => (
    <span class="label" key={profile}>{profile}:{gen}</span>
  ));
}

function HostRow({ host, now }) {
  const name = host.metadata.name;
  const drifted = condition(host, 'Drifted');
  return (
    <tr data-host={name}>
      <td class="name"><a href={href(['hosts', name])}>{name}</a></td>
      {CONDITIONS.map((type) => {
        const c = condition(host, type);
        return (
          <td key={type} class="cond">
            <Badge type={type} status={c ? c.status : 'Unknown'} reason={c ? `${c.reason}: ${c.message}` : ''} />
          </td>
        );
      })}
      <td class="num" data-drifted-for={drifted && drifted.status === 'True' ? '' : undefined}>
        {drifted && drifted.status === 'True' ? since(drifted.lastTransitionTime, now) : ''}
      </td>
      <td class="wrap"><Labels labels={host.metadata.labels} /></td>
      <td class="wrap"><Generations generations={host.status.appliedGenerations} /></td>
    </tr>
  );
}

export function FleetPage({ query }) {
  const selector = query.get('selector') || '';
  const wanted = query.getAll('condition').filter((c) => /^\w+=(True|False|Unknown)$/.test(c));
  const size = PAGE_SIZES.includes(Number(query.get('limit'))) ? Number(query.get('limit')) : PAGE_SIZES[0];
  // continue tokens of the pages before this one: Back pops, Next pushes
  // (kept per filter: another filter starts at its first page, with no stale token)
  const filterKey = `${selector}|${wanted.join('&')}|${size}`;
  const [paging, setPaging] = useState({ key: filterKey, pages: [] });
  const pages = paging.key === filterKey ? paging.pages : [];
  const setPages = (next) => setPaging({ key: filterKey, pages: next });
  const token = pages.length ? pages[pages.length - 1] : undefined;
  const now = useNow(1000);

  const list = usePoll('hosts', {
    query: { limit: size, continue: token, labelSelector: selector || undefined, condition: wanted },
  });
  const summaryCall = usePoll('fleet/summary', { query: { labelSelector: selector || undefined } });

  const items = (list.data && list.data.items) || [];
  const next = list.data && list.data.metadata.continue;
  const remaining = list.data && list.data.metadata.remainingItemCount;
  const summary = summaryCall.data;

  function setFilter(event) {
    event.preventDefault();
    const form = event.currentTarget.elements;
    const conditions = CONDITIONS.map((t) => form[`cond-${t}`].value).filter(Boolean);
    go(['fleet'], { selector: form.selector.value.trim(), condition: conditions, limit: form.limit.value });
  }
  const selected = Object.fromEntries(wanted.map((w) => w.split('=')));
  const expired = list.error && (list.error.status === 410 || list.error.status === 400) && token;

  return (
    <div class="fleet">
      <h1>Fleet</h1>
      <Counts summary={summary} wanted={wanted} selector={selector} />
      <form class="filters" onSubmit={setFilter} aria-label="Filter hosts" key={filterKey}>
        <label>
          Label selector
          <input name="selector" defaultValue={selector} placeholder="role=streamer,zone in (a,b)" size={28}
            aria-describedby="selector-help" />
        </label>
        {CONDITIONS.map((type) => (
          <label key={type}>
            {type}
            <select name={`cond-${type}`} defaultValue={selected[type] ? `${type}=${selected[type]}` : ''}>
              <option value="">any</option>
              {STATUSES.map((s) => <option key={s} value={`${type}=${s}`}>{s}</option>)}
            </select>
          </label>
        ))}
        <label>
          Per page
          <select name="limit" defaultValue={String(size)}>
            {PAGE_SIZES.map((n) => <option key={n} value={n}>{n}</option>)}
          </select>
        </label>
        <button type="submit">Filter</button>
        <span id="selector-help" class="muted small">CLI: stortune get hosts -l SELECTOR</span>
      </form>
      {expired ? (
        <div class="error" role="alert">
          The list moved on since this page was read ({list.error.message}).{' '}
          <button type="button" onClick={() => setPages([])}>Back to the first page</button>
        </div>
      ) : <ErrorBox error={list.error} />}
      <div class="scroll">
        <table class="hosts" aria-busy={!list.loaded} data-loaded={list.loaded ? 'true' : 'false'}>
          <colgroup>
            <col class="c-name" />
            {CONDITIONS.map((c) => <col key={c} class="c-cond" />)}
            <col class="c-num" />
            <col class="c-labels" />
            <col class="c-gen" />
          </colgroup>
          <thead>
            <tr>
              <th scope="col">Host</th>
              {CONDITIONS.map((c) => <th scope="col" key={c}>{c}</th>)}
              <th scope="col" title="Since the Drifted condition turned True">Drifted for</th>
              <th scope="col">Labels</th>
              <th scope="col">Profile generations</th>
            </tr>
          </thead>
          <tbody>
            {!list.loaded && <Placeholder columns={COLUMNS} rows={Math.min(size, 20)} />}
            {list.loaded && items.length === 0 && !list.error && <Empty columns={COLUMNS}>No host matches.</Empty>}
            {items.map((h) => <HostRow key={h.metadata.name} host={h} now={now} />)}
          </tbody>
        </table>
      </div>
      <nav class="pager" aria-label="Pages of hosts">
        <button type="button" disabled={!pages.length} onClick={() => setPages(pages.slice(0, -1))}>
          ← Previous
        </button>
        <span class="muted" data-testid="page-info">
          page {pages.length + 1}
          {remaining !== undefined && remaining !== null ? `, ${remaining} more after this page` : ''}
        </span>
        <button type="button" disabled={!next} onClick={() => setPages([...pages, next])}>Next →</button>
      </nav>
    </div>
  );
}
