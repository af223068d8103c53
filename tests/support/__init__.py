"""What several test files share: the services and servers they start (PostgreSQL, MariaDB, Redis,
Sentinel, Cluster), the fault proxies, worker processes, mutants of the backends, and helpers."""
