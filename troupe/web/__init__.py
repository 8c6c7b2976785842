"""The HTTP face of the control plane (aiohttp): routes per resource, auth and Host
checks, SSE streams, the OpenAPI document and Prometheus metrics."""
