"""The HTTP API (/api/v1): thin routes over the services, Kubernetes conventions where they fit.

Decisions a client can rely on:

- Documents carry apiVersion/kind/metadata/spec/status. ``metadata.generation``
  moves only when the spec changes (compared in its canonical form: defaults
  filled, unset fields absent); ``metadata.resourceVersion`` is opaque and
  changes on every write, status writes included. A write that changes nothing
  keeps it.
- PUT with ``metadata.resourceVersion`` (and/or ``metadata.uid``) is
  conditional: a mismatch is 409 Conflict. Without them the update is
  unconditional, as Kubernetes allows for most kinds (``kubectl replace``).
- A profile being deleted (deletionTimestamp set) cannot be replaced or created
  again: 409 until it is gone.
- DELETE of a profile no host has applied removes it at once (200, the object
  with deletionTimestamp). Otherwise it is 202 and the finalizer
  ``stortune.io/restore-settings`` holds the row until every host that applied
  it reports it restored, or is deleted (DELETE /hosts/{name}).
- ``?dryRun=All`` on POST/PUT validates exactly as the real request would
  (409s included), stores nothing and returns the plan for every host the
  selector matches. A profile whose settings a host rejects is still
  storable: dry run is where that shows.
- Host labels: agents report labels at registration; operators set labels
  through PUT/PATCH /hosts/{name}/labels. Selectors see both, and an API-set
  label wins over a reported one with the same key. Reported labels are
  replaced at each registration; API labels only through the API.
- A host heartbeat renews its lease with one UPDATE; it is not a resource
  write, so the host's resourceVersion does not move.
- Host status is written by the reconciler only. Conditions: Reachable (the
  agent's lease and answers), Applied (every selecting profile's generation
  is in place; False with reason Rejected or ApplyFailed), Drifted (a setting
  that was in sync at its profile's generation changed), and Ready =
  Reachable and Applied and not Drifted, whose reason names the first
  condition in the way. lastTransitionTime moves only when a status flips.
  ``status.devices`` is the settings table: desired, observed, inSync and
  the profile/rule/mode each value comes from.
- Every error is a Status body (reason NotFound, AlreadyExists, Conflict,
  Invalid, BadRequest...). 422 lists ``details.causes`` with the field path
  inside the document, e.g. ``spec.rules[0].settings.read_ahead_kb``.
- A path name that is not a valid object name is 404, never a query.
- Every call under /api/v1 needs a bearer token (api/access.py); no, an
  unknown, a revoked or an expired one is 401 with ``WWW-Authenticate:
  Bearer``, before the body is read or the path routed. Each route declares
  the permission it needs (api/security.py; the app is not built otherwise)
  and a role without it gets 403. /healthz, /livez, /docs and /openapi.json are
  public: the API's shape is no secret, and /docs is where a token is pasted.
- A support token's host selector is applied to every host read: a host it
  does not match answers 404 like a host that does not exist, lists leave it
  out, and events about it are not shown.
- Mutating calls (heartbeats excepted) and endpoints marked ``@audited``
  leave an audit record whatever their outcome (api/audit.py).
- Expensive calls spend a per-token budget: 429 with Retry-After when it is
  spent (api/ratelimit.py). Bodies are bounded in size (413) and nesting
  (400) before any parser runs (api/limits.py).
"""
