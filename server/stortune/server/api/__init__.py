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
- Every error is a Status body (reason NotFound, AlreadyExists, Conflict,
  Invalid, BadRequest...). 422 lists ``details.causes`` with the field path
  inside the document, e.g. ``spec.rules[0].settings.read_ahead_kb``.
- A path name that is not a valid object name is 404, never a query.
"""
