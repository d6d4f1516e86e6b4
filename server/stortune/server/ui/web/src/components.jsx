// Pieces every page uses. Every value from hosts is a text child (JSX escapes it): nothing
// here sets HTML from data.
import { createContext } from 'preact';
import { useContext } from 'preact/hooks';

export const Session = createContext(null);

export function useSession() {
  return useContext(Session);
}

/** Whether the signed-in token's role may do this (the API's permission names). */
export function useCan(permission) {
  const session = useSession();
  return Boolean(session && session.permissions.includes(permission));
}

export const WRITE = {
  profiles: 'write profiles',
  labels: 'label hosts',
  benchmarks: 'run benchmarks',
  experiments: 'run tuning experiments',
  deleteHosts: 'delete hosts',
  diagnostics: 'download diagnostics',
};

export function Badge({ type, status, reason, title }) {
  // Drifted=True and the others False are the bad states
  const bad = type === 'Drifted' ? status === 'True' : status === 'False';
  const tone = status === 'Unknown' ? 'unknown' : bad ? 'bad' : 'good';
  return (
    <span class={`badge badge-${tone}`} title={title || reason || ''} data-condition={type} data-status={status}>
      {type}
      {status !== 'True' || type === 'Drifted' ? `=${status}` : ''}
    </span>
  );
}

export function Labels({ labels }) {
  const entries = Object.entries(labels || {});
  if (!entries.length) return <span class="muted">none</span>;
  return (
    <span class="labels">
      {entries.map(([k, v]) => (
        <span class="label" key={k}>
          {k}={v}
        </span>
      ))}
    </span>
  );
}

export function ErrorBox({ error }) {
  if (!error) return null;
  return (
    <div class="error" role="alert">
      <strong>{error.status ? `${error.status}: ` : ''}</strong>
      {error.message}
      {error.causes && error.causes.length > 0 && (
        <ul>
          {error.causes.map((c, i) => (
            <li key={i}>
              <code>{c.field}</code>: {c.message}
            </li>
          ))}
        </ul>
      )}
    </div>
  );
}

export function Section({ title, children, id, actions }) {
  return (
    <section class="card" aria-labelledby={id ? `${id}-title` : undefined} id={id}>
      <header class="card-head">
        <h2 id={id ? `${id}-title` : undefined}>{title}</h2>
        {actions}
      </header>
      {children}
    </section>
  );
}

/** Rows of a table that keeps its height while data arrives: placeholders until `loaded`. */
export function Placeholder({ columns, rows = 5 }) {
  return Array.from({ length: rows }, (_, i) => (
    <tr class="placeholder" key={`p${i}`} aria-hidden="true">
      {Array.from({ length: columns }, (__, j) => (
        <td key={j}>&nbsp;</td>
      ))}
    </tr>
  ));
}

export function Empty({ columns, children }) {
  return (
    <tr>
      <td colSpan={columns} class="muted">
        {children}
      </td>
    </tr>
  );
}
