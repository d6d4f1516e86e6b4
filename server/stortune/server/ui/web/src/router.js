// Pages live in the URL's fragment (#/hosts/web-1): the server serves one page at /ui/ and
// nothing else, so no path a visitor types reaches a file lookup.
import { useEffect, useState } from 'preact/hooks';

export function parseRoute(hash = location.hash) {
  const [path, search] = hash.replace(/^#/, '').split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  return { parts, query: new URLSearchParams(search || '') };
}

export function useRoute() {
  const [route, setRoute] = useState(parseRoute());
  useEffect(() => {
    const changed = () => setRoute(parseRoute());
    window.addEventListener('hashchange', changed);
    return () => window.removeEventListener('hashchange', changed);
  }, []);
  return route;
}

/** '#/hosts/web-1' from ('hosts', 'web-1'), each part escaped; query an object. */
export function href(parts, query) {
  const path = '#/' + parts.map((p) => encodeURIComponent(p)).join('/');
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) {
    for (const one of Array.isArray(v) ? v : [v]) if (one !== undefined && one !== '' && one !== null) q.append(k, one);
  }
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

export function go(parts, query) {
  location.hash = href(parts, query);
}
