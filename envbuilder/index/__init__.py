"""The package indexes: HTTP (cache, retries, ranges, offline), the Simple Repository
API (PEP 503 HTML and PEP 691 JSON), files inside remote wheels, and pip's configuration."""
