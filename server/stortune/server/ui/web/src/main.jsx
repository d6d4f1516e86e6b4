// The dashboard: sign-in, the navigation, and the page the URL's fragment names.
import { render } from 'preact';
import { lazy, Suspense } from 'preact/compat';
import { useEffect, useState } from 'preact/hooks';
import 'uplot/dist/uPlot.min.css';
import './app.css';
import { api, ApiError, onSignedOut, setCsrf } from './api.js';
import { ErrorBox, Session } from './components.jsx';
import { useRoute } from './router.js';
import { FleetPage } from './pages/fleet.jsx';
import { HostPage } from './pages/host.jsx';
import { BenchmarksPage, ComparePage, RunPage } from './pages/benchmarks.jsx';
import { ExperimentPage, ExperimentsPage } from './pages/experiments.jsx';

// The profile editor brings a YAML parser and a JSON Schema validator: loaded when first shown.
const ProfilesPage = lazy(() => import('./pages/profiles.jsx').then((m) => ({ default: m.ProfilesPage })));

function SignIn({ onSession, notice }) {
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  async function submit(event) {
    event.preventDefault();
    const field = event.currentTarget.elements.token;
    const token = field.value.trim();
    field.value = ''; // the token is handed to the server once and kept nowhere here
    setBusy(true);
    try {
      const { data } = await api('session', { method: 'POST', bearer: token });
      setCsrf(data.csrfToken);
      onSession(data);
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  }
  return (
    <main class="signin" id="main">
      <h1>stortune</h1>
      <form onSubmit={submit} aria-label="Sign in">
        <label for="token">API token</label>
        <input id="token" name="token" type="password" autocomplete="off" spellcheck={false} required
          placeholder="stt_…" autoFocus />
        <button type="submit" disabled={busy}>Sign in</button>
        <p class="muted">
          The token is exchanged for a session cookie that page scripts cannot read; make one with
          <code> stortune token create --role viewer</code>.
        </p>
        {notice && <p class="notice" role="status">{notice}</p>}
        <ErrorBox error={error} />
      </form>
    </main>
  );
}

const NAV = [
  ['fleet', 'Fleet'],
  ['profiles', 'Profiles'],
  ['benchmarks', 'Benchmarks'],
  ['experiments', 'Experiments'],
];

function Page({ route }) {
  const [first, ...rest] = route.parts;
  switch (first || 'fleet') {
    case 'fleet':
      return <FleetPage query={route.query} />;
    case 'hosts':
      return <HostPage name={rest[0]} />;
    case 'profiles':
      return (
        <Suspense fallback={<p class="muted">Loading the profile editor…</p>}>
          <ProfilesPage name={rest[0]} mode={rest[1]} />
        </Suspense>
      );
    case 'benchmarks':
      return rest[0] ? <RunPage id={rest[0]} /> : <BenchmarksPage query={route.query} />;
    case 'compare':
      return <ComparePage a={rest[0]} b={rest[1]} />;
    case 'experiments':
      return rest[0] ? <ExperimentPage id={rest[0]} /> : <ExperimentsPage />;
    default:
      return <p>No such page. <a href="#/fleet">The fleet</a></p>;
  }
}

function App() {
  const route = useRoute();
  const [session, setSession] = useState(undefined); // undefined: still asking
  const [notice, setNotice] = useState(null);

  useEffect(() => {
    // A reload keeps the cookie: ask who we are (and the CSRF token) instead of signing in again.
    api('session')
      .then(({ data }) => {
        if (data.cookie) {
          setCsrf(data.csrfToken);
          setSession(data);
        } else setSession(null);
      })
      .catch(() => setSession(null));
    return onSignedOut(() => {
      setCsrf(null);
      setSession(null);
      setNotice('The session ended (signed out, expired, or its token revoked): sign in again.');
    });
  }, []);

  useEffect(() => {
    document.title = `stortune: ${route.parts[0] || 'fleet'}${route.parts[1] ? ' ' + route.parts[1] : ''}`;
    const main = document.getElementById('main');
    if (main) main.focus({ preventScroll: true });
  }, [route.parts.join('/')]);

  if (session === undefined) return <main id="main" class="loading" aria-busy="true" />;
  if (session === null) return <SignIn onSession={(s) => { setNotice(null); setSession(s); }} notice={notice} />;

  async function signOut() {
    try {
      await api('session', { method: 'DELETE' });
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
    }
    setCsrf(null);
    setSession(null);
  }

  const current = route.parts[0] || 'fleet';
  const section = current === 'hosts' ? 'fleet' : current === 'compare' ? 'benchmarks' : current;
  return (
    <Session.Provider value={session}>
      <a class="skip" href="#main" onClick={(e) => { e.preventDefault(); document.getElementById('main').focus(); }}>
        Skip to content
      </a>
      <header class="top">
        <span class="brand">stortune</span>
        <nav aria-label="Pages">
          {NAV.map(([key, label]) => (
            <a key={key} href={`#/${key}`} aria-current={section === key ? 'page' : undefined}>{label}</a>
          ))}
        </nav>
        <span class="who" data-role={session.token.role}>
          {session.token.name} ({session.token.role})
        </span>
        <button type="button" class="link" onClick={signOut}>Sign out</button>
      </header>
      <main id="main" tabIndex={-1}>
        <Page route={route} />
      </main>
    </Session.Provider>
  );
}

render(<App />, document.getElementById('app'));
