// The one door to the control plane: its public REST API, relative to this page (/ui/ -> /api/v1/),
// so a path prefix in front of the server is kept. The session cookie travels by itself
// (HttpOnly: no script here can read it); writes carry the session's CSRF token.

const BASE = new URL('../api/v1/', document.baseURI);
const SAFE = new Set(['GET', 'HEAD', 'OPTIONS']);

let csrfToken = null;
const signedOutListeners = new Set();

export function setCsrf(token) {
  csrfToken = token;
}

/** Called when the server no longer accepts the session (401): back to the sign-in form. */
export function onSignedOut(listener) {
  signedOutListeners.add(listener);
  return () => signedOutListeners.delete(listener);
}

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
    // [{field, message}]: a 422 names each invalid field
    this.causes = (body && body.details && body.details.causes) || [];
  }
}

export function apiUrl(path, query) {
  const url = new URL(path.replace(/^\//, ''), BASE);
  for (const [key, value] of Object.entries(query || {})) {
    for (const one of Array.isArray(value) ? value : [value]) {
      if (one !== undefined && one !== null && one !== '') url.searchParams.append(key, String(one));
    }
  }
  return url;
}

/**
 * One call. Options: method, query, body (an object: JSON; a string: YAML), etag (sent as
 * If-None-Match: a 304 answers {status: 304}), bearer (sign-in only).
 * Answers {status, data, etag}; throws ApiError for 4xx/5xx.
 */
export async function api(path, { method = 'GET', query, body, etag, bearer, raw = false } = {}) {
  const headers = { Accept: 'application/json' };
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  else if (!SAFE.has(method) && csrfToken) headers['X-CSRF-Token'] = csrfToken;
  if (etag) headers['If-None-Match'] = etag;
  let payload;
  if (typeof body === 'string') {
    headers['Content-Type'] = 'application/yaml';
    payload = body;
  } else if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    payload = JSON.stringify(body);
  }
  const response = await fetch(apiUrl(path, query), {
    method, headers, body: payload, credentials: 'same-origin', cache: 'no-store',
  });
  if (response.status === 304) return { status: 304, etag };
  const text = await response.text();
  let data = null;
  if (raw) data = text;
  else if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { message: text.slice(0, 500) };
    }
  }
  if (!response.ok) {
    if (response.status === 401 && !bearer) signedOutListeners.forEach((f) => f());
    throw new ApiError(response.status, raw ? { message: text.slice(0, 500) } : data);
  }
  return { status: response.status, data, etag: response.headers.get('ETag') };
}
