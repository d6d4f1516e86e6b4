"""Wire models of the HTTP API: request bodies and public views, apart from the tables."""
