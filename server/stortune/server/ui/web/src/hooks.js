// Live data: poll a GET with the ETag the API serves (304 costs the server a counter read),
// pause while the tab is hidden, and keep the last answer on screen while the next one loads.
import { useEffect, useRef, useState } from 'preact/hooks';
import { api } from './api.js';

export function usePoll(path, { query, interval = 3000, enabled = true } = {}) {
  const [state, setState] = useState({ data: null, error: null, loaded: false, at: 0 });
  const key = path + '?' + JSON.stringify(query || {});
  const keyRef = useRef(key);
  keyRef.current = key;
  const [nudge, setNudge] = useState(0);

  useEffect(() => {
    if (!enabled || !path) return undefined;
    let etag = null;
    let timer = null;
    let stopped = false;
    const myKey = key;
    setState((s) => ({ ...s, error: null, loaded: s.loaded && s.key === myKey, key: myKey }));
    async function tick() {
      if (stopped) return;
      if (document.hidden) {
        timer = setTimeout(tick, interval);
        return;
      }
      try {
        const answer = await api(path, { query, etag });
        if (stopped || keyRef.current !== myKey) return;
        if (answer.status !== 304) {
          etag = answer.etag;
          setState({ data: answer.data, error: null, loaded: true, at: Date.now(), key: myKey });
        }
      } catch (error) {
        if (!stopped) setState((s) => ({ ...s, error, loaded: true, key: myKey }));
      }
      if (!stopped && interval > 0) timer = setTimeout(tick, interval);
    }
    tick();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [key, enabled, interval, nudge]);

  return { ...state, refresh: () => setNudge((n) => n + 1) };
}

/** The time now, every `ms`: for durations that grow on screen ("drifted for 3m 20s"). */
export function useNow(ms = 1000) {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(timer);
  }, [ms]);
  return now;
}

/** A one-off GET (no polling). */
export function useFetch(path, query) {
  return usePoll(path, { query, interval: 0, enabled: Boolean(path) });
}
