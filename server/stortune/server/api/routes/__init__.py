"""One router per resource; gathered in stortune.server.api.router."""
