"""Queries and writes behind the routes.

Each public function that writes is one unit of work: it takes the write lock
(``next_resource_version``) before touching rows, records its events, asks for
reconciles and commits. Functions documented as "part of the caller's
transaction" do not commit.
"""
