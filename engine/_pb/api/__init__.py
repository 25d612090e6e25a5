"""The request and response path: routes, request fields, parsing, formatting, usage."""
