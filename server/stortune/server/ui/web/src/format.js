// How numbers and times are written on every page.

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '–';
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function since(iso, now = Date.now()) {
  if (!iso) return '–';
  return duration((now - Date.parse(iso)) / 1000);
}

export function when(iso) {
  if (!iso) return '–';
  const d = new Date(typeof iso === 'number' ? iso * 1000 : iso);
  return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

const UNITS = ['', 'k', 'M', 'G', 'T', 'P'];

export function si(value, unit = '') {
  if (value === null || value === undefined || !Number.isFinite(value)) return '–';
  let v = value;
  let i = 0;
  while (Math.abs(v) >= 1000 && i < UNITS.length - 1) {
    v /= 1000;
    i += 1;
  }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${UNITS[i]}${unit}`.trim();
}

export function bytes(value) {
  return si(value, 'B');
}

export function pct(value, digits = 1) {
  if (value === null || value === undefined || !Number.isFinite(value)) return '–';
  return `${value > 0 ? '+' : ''}${value.toFixed(digits)}%`;
}

/** A metric's value in its unit, as the API names metrics (docs/benchmarks.md). */
export function metric(name, value) {
  if (value === null || value === undefined) return '–';
  if (name.endsWith('_bandwidth')) return si(value, 'B/s');
  if (name.endsWith('_iops')) return si(value, ' IO/s');
  if (name.includes('_lat_')) return value >= 1000 ? `${(value / 1000).toFixed(2)} ms` : `${value.toFixed(0)} µs`;
  if (name.startsWith('cpu_')) return `${value.toFixed(1)}%`;
  return String(Math.round(value * 100) / 100);
}

export function condition(host, type) {
  const found = ((host.status && host.status.conditions) || []).find((c) => c.type === type);
  return found || null;
}

/** matchLabels/matchExpressions -> the labelSelector query syntax the API reads. */
export function selectorText(selector) {
  if (!selector) return '';
  const parts = Object.entries(selector.matchLabels || {}).map(([k, v]) => `${k}=${v}`);
  for (const e of selector.matchExpressions || []) {
    if (e.operator === 'In') parts.push(`${e.key} in (${e.values.join(',')})`);
    else if (e.operator === 'NotIn') parts.push(`${e.key} notin (${e.values.join(',')})`);
    else if (e.operator === 'Exists') parts.push(e.key);
    else if (e.operator === 'DoesNotExist') parts.push(`!${e.key}`);
  }
  return parts.join(',');
}
